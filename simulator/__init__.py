"""A vLLM replica stand-in: vLLM's HTTP API, LoRA slots, load latency, timing model, faults.

Entry points: ``simulator.app.create_app`` (ASGI, in process), ``simulator.procs`` (real
processes), ``simulator.cli.simulate`` (``loraplane simulate``), ``simulator.engine`` (the pure
timing model), ``simulator.conformance`` (checks any vLLM-compatible URL).
"""
