"""Tooling for tests and benchmarks, kept out of the runtime packages: a launcher for the server
as a subprocess (`launcher`), upstream ChatTTS loaded from our assets (`upstream`), replica timing
(`sharing`) and the counters of a streaming decoder's forward passes (`decode_probe`)."""
