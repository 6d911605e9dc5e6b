"""gRPC transport: servicers, validation, pb <-> domain conversion. No tensor code."""
