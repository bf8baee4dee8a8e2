"""Session state codec, version upcasters and state stores."""
