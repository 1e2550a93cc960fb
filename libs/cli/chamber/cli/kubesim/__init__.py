"""An emulated Kubernetes cluster for trying Chamber without one (`chamber up --kube-emulator`) and for tests.

`apiserver` is the API server (kmock's emulator, extended); `cluster` plays the nodes, the Job controller and
the kubelets; `serve` runs both on a port until stopped.
"""
