"""``python -m infra.sandbox.fleet_simulator --kube-url URL``: the sandbox's fleet simulator process."""

from infra.sandbox.fleet_simulator.server import main

main()
