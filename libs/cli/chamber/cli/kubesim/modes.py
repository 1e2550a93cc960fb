"""`chamber up --kube-emulator`: the settings that point every service at an emulated Kubernetes API."""

from chamber.cli.infra import free_port
from chamber.common.settings import Settings


def emulator_mode(settings: Settings) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The environment for the services and the extra child (the emulator) to run first."""
    api_port, hook_port = free_port(), free_port()
    api = f"http://127.0.0.1:{api_port}"
    webhooks = f"http://127.0.0.1:{hook_port}"
    env = {
        "CHAMBER_KUBE_API": api, "CHAMBER_EXECUTOR": "kubernetes", "CHAMBER_INVENTORY_SOURCE": "kubernetes",
        "CHAMBER_KUBE_WEBHOOK_HOST": "127.0.0.1", "CHAMBER_KUBE_WEBHOOK_PORT": str(hook_port),
    }  # fmt: skip
    extra = {"kube-emulator": ["kube-emulator", "--port", str(api_port), "--webhook-url", webhooks]}
    return env, extra
