"""The one model of an LLM serving fleet, shared by the benchmarks (simulated time) and the
sandbox's fleet simulator (real time).

- ``engine``: a vLLM engine's KV cache and step time, from ``calibration.yaml`` (``load_engine``);
- ``replica``: a vLLM replica at the level of requests and scheduler steps (``Replica``, ``Request``);
- ``fleet``: a fleet under a scaling policy, request by request (``RequestLevel``) or mean-field
  (``Aggregate``), through one control loop (``simulate`` -> ``Result``);
- ``metrics``: vLLM's histogram buckets, Prometheus' ``histogram_quantile``, DCGM utilisation;
- ``sizes``: prompt/output token distributions per time window from the traces (``SizeMix``).
"""
