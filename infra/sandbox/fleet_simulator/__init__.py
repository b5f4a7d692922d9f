"""Fleet simulator: simulated vLLM replicas and DCGM GPUs for the pods of the emulated cluster.

Every tick it reads pods, services, HTTPRoutes, nodes and the ``fleet-profiles`` /
``fleet-demand`` ConfigMaps from the Kubernetes API emulator over HTTP (official client), splits
each logical deployment's demand between versions by the HTTPRoute's backend weights and between
the Ready pods of a version, and runs each pod's vLLM engine, under the batching arguments of its
container (``--max-num-seqs``, ``--max-num-batched-tokens``, chunked prefill), with the fleet model the benchmarks
score (``infra.fleetmodel``: continuous batching, KV cache, preemption, calibrated step times),
so waiting requests, TTFT and GPU utilisation behave here as the benchmark says they do.
It serves what gates and scaling loops read in production: each Ready pod's vLLM exposition on the
pod's own ``<podIP>:<port>/metrics`` (pod_listeners.py; the sandbox's Prometheus finds them by pod
discovery), DCGM's and kube-state-metrics' series on ``GET /metrics``, the gateway's own on
``GET /gateway/metrics``; and an OpenAI-compatible ``POST /proxy/{namespace}/{service}/v1/completions``
whose requests join the pod's engine and are answered when it has generated them, and
``POST /gateway/{namespace}/{route}/v1/completions``, which routes as the Gateway would: the
HTTPRoute's rule for the request's headers, then an InferencePool's replica with the least queue
or a Service's (infra/sandbox/gateway.py); the answering pod is in the ``x-tideplane-pod`` header.
The gateway enforces one Envoy Gateway ``BackendTrafficPolicy`` per route, the oldest (a later one
on the same route is reported ``Accepted=False``, reason ``Conflicted``, and not enforced): once the requests
waiting in the engines behind it reach its ``circuitBreaker.maxPendingRequests``, a request is
answered 429 with ``Retry-After`` at once and counted in ``envoy_cluster_upstream_rq_pending_overflow``
(the simulated demand of ``fleet-demand`` enters the engines directly, not through the gateway).
Its BackendTrafficPolicies' token rate limits answer 429, and it counts each answer's tokens per
tenant in ``gen_ai_client_token_usage`` (infra/sandbox/ratelimit.py).

Time is scaled: with ``--time-scale 10`` one real second is ten sandbox seconds, so counters grow
ten times faster and a proxied request waits a tenth of its simulated latency. Latency values
themselves are in sandbox seconds.

Modules: simulator.py (FleetSimulator), replicas.py (a pod's SimulatedReplica), cluster.py (what it reads
of the cluster), exposition.py (/metrics), server.py (the HTTP server and the tick loop); run it with
``python -m infra.sandbox.fleet_simulator``. The fleet model it runs is infra/fleetmodel/.
"""
