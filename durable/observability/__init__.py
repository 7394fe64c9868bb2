"""What the engine tells about itself: Prometheus metrics (and a worker's metrics port),
OpenTelemetry traces, structured log context.
"""
