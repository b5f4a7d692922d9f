"""`python -m infra.sandbox.kubeapi --host 127.0.0.1 --port P --time-scale X [--fault-rate R ...]`."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import re
import signal

from .faults import KINDS, Faults
from .server import KubeApiServer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m infra.sandbox.kubeapi", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=16443)
    parser.add_argument("--time-scale", type=float, default=1.0, help="sandbox seconds per real second")
    parser.add_argument("--fault-rate", type=float, default=0.0, help="fraction of API requests that fail")
    parser.add_argument("--fault-kinds", default="500", help=f"comma-separated subset of {','.join(KINDS)}")
    parser.add_argument("--fault-delay", type=float, default=1.0, help="seconds a 'delay' fault waits")
    parser.add_argument("--watch-history", type=int, default=20000,
                        help="changes kept for watches that resume from a resourceVersion (older: 410 Gone)")
    parser.add_argument("--pod-network", default="10.244",
                        help="the first two octets of pod IPs (e.g. 127.77: loopback addresses a local process can bind, "
                        "one per pod, as Prometheus' Kubernetes discovery reaches them)")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    if args.time_scale <= 0:
        parser.error("--time-scale must be > 0")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        faults = Faults(args.fault_rate, args.fault_kinds.split(","), args.fault_delay)
    except Exception as exc:  # ApiError from validation: report as a CLI error
        parser.error(str(exc))
    if not re.fullmatch(r"(25[0-5]|2[0-4]\d|1?\d?\d)\.(25[0-5]|2[0-4]\d|1?\d?\d)", args.pod_network):
        parser.error(f"--pod-network must be two octets, e.g. 10.244 (got {args.pod_network!r})")
    server = KubeApiServer(args.host, args.port, args.time_scale, faults, args.watch_history, args.pod_network)

    def stop(*_: object) -> None:
        raise SystemExit(0)  # interrupts serve_forever at once; watch threads are daemons

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` dumps every thread's stack to stderr
    signal.signal(signal.SIGTERM, stop)
    print(f"kubeapi emulator listening on http://{args.host}:{args.port} (time scale {args.time_scale})",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stopping = True
        server.controllers.stop()
        server.server_close()


if __name__ == "__main__":
    main()
