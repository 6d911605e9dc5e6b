"""Tooling for tests and benchmarks, kept out of the runtime packages: a launcher for the server
as a subprocess (`launcher`) and upstream ChatTTS loaded from our assets (`upstream`)."""
