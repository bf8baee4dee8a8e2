"""Pydantic models of every message on the wire, their orjson codec and the contract export.

The runtime needs only :mod:`service.wire.codec` (``decode_command``, ``decode_control``,
``encode_result``, ``encode_event``), :mod:`service.wire.results` (``result_record``,
``error_record``, ``deleted_result``), :mod:`service.wire.dlq` (header names) and
:class:`service.wire.errors.WireError`, the one error decoding raises.
"""
