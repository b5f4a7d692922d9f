"""The scaling loops' side effects (the contracts are workflows/scaling/contract.py):
``ScalingActivities`` (a deployment's scale, its signals in Prometheus, the gateway's queue limit)
and ``NodePoolActivities`` (a GPU node pool's nodes, Auto Scaling group and warm pool)."""
