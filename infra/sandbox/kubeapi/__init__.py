"""A Kubernetes API emulator for the sandbox: REST + watch + simulated controllers over plain HTTP.

The official `kubernetes` client and a stock `kubectl` talk to it unchanged, so tideplane's
activities are tested against the same protocol they use in production.
"""
