"""Model providers behind the engine's ModelProvider seam."""
