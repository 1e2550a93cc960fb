"""Submit an ordinary Kubernetes Job to Chamber with the official `kubernetes` client, and watch it run.

    chamber up --kube-emulator            # prints the emulated API's URL
    python deploy/examples/kube_job.py http://127.0.0.1:PORT [--chamber http://127.0.0.1:8080]

On a real cluster, pass `kubeconfig` instead of a URL. The Job is labelled `chamber.io/team`: Chamber's webhook
suspends it on creation, Chamber admits and places it, unsuspends it and binds its pods to the nodes it chose;
here the emulator's kubelets run each pod for the `chamber.io/sim-duration-s` annotation's seconds.
"""

import argparse
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

from kubernetes import client, config


def job(name: str, replicas: int, gpus: int, seconds: float) -> dict[str, object]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {"chamber.io/team": "nlp", "chamber.io/priority": "train"},
            "annotations": {"chamber.io/sim-duration-s": str(seconds), "chamber.io/topology": "rack"},
        },
        "spec": {
            "parallelism": replicas,
            "completions": replicas,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 30,
                    "containers": [
                        {
                            "name": "train",
                            "image": "ghcr.io/example/llama-ft:latest",
                            "command": ["torchrun", "train.py"],
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                }
            },
        },
    }


def _dev_token() -> str:
    path = Path(".chamber") / "dev-admin-token"
    return path.read_text().strip() if path.exists() else ""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("api", help="the API server URL (chamber up --kube-emulator prints it) or `kubeconfig`")
    parser.add_argument("--chamber", default="http://127.0.0.1:8080", help="Chamber's API")
    parser.add_argument(
        "--token", default=os.environ.get("CHAMBER_TOKEN") or _dev_token(),
        help="a Chamber API token to read the job with (default: CHAMBER_TOKEN, else `make up`'s development token)",
    )  # fmt: skip
    parser.add_argument("--name", default=f"llama-ft-{int(time.time()) % 100000}")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    if args.api == "kubeconfig":
        config.load_kube_config()
        api = client.ApiClient()
    else:
        cfg = client.Configuration()
        cfg.host = args.api
        api = client.ApiClient(cfg)
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    started = time.monotonic()
    created = batch.create_namespaced_job("default", job(args.name, args.replicas, args.gpus, args.seconds))
    job_id = f"k8s-{created.metadata.uid}"
    print(f"{time.monotonic() - started:5.1f} s  created Job {args.name}: suspend={created.spec.suspend}, "
          f"schedulerName={created.spec.template.spec.scheduler_name}, Chamber job {job_id}")  # fmt: skip
    last = ""
    while time.monotonic() - started < 120:
        current = batch.read_namespaced_job(args.name, "default")
        pods = core.list_namespaced_pod("default", label_selector=f"batch.kubernetes.io/job-name={args.name}").items
        where = ", ".join(f"{p.metadata.name}@{p.spec.node_name or '-'}:{p.status.phase}" for p in pods)
        conditions = [c.type for c in current.status.conditions or [] if c.status == "True"]
        try:
            asked = urllib.request.Request(f"{args.chamber}/v1/jobs/{job_id}")
            if args.token:
                asked.add_header("Authorization", f"Bearer {args.token}")
            with urllib.request.urlopen(asked, timeout=2) as resp:
                state = json.loads(resp.read()).get("state", "?")
        except OSError:
            state = "(not yet in Chamber)"
        line = f"suspend={current.spec.suspend} pods=[{where}] conditions={conditions} chamber={state}"
        if line != last:
            print(f"{time.monotonic() - started:5.1f} s  {line}", flush=True)
            last = line
        if state in ("succeeded", "failed", "cancelled"):
            return 0 if state == "succeeded" else 1
        time.sleep(0.25)
    print("timed out", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
