"""``nki-pa env``: the text form of ``host.environment.environment_report`` (what a launch would
run on here: API, package, LNC, the torch device path)."""
from __future__ import annotations

from typing import Any


def format_report(report: dict[str, Any], version: str) -> str:
    """``report`` (``host.environment.environment_report``) as text lines."""
    pkgs = report["packages"]
    lines = [f"nki-paged-attention {version} (Python {report['python']})",
             "packages: " + ", ".join(f"{k} {v}" for k, v in pkgs.items() if v),
             "not installed: " + (", ".join(k for k, v in pkgs.items() if not v) or "-"),
             "environment: " + (", ".join(f"{k}={v}" for k, v in report["environment"].items()
                                          if v is not None) or "none of the NKI variables set"),
             f"neuronx-cc --lnc (NEURON_CC_FLAGS): {report['compiler_lnc'] or '-'}",
             f"legacy namespace neuronxcc.nki: {_text(report['legacy_namespace'])}"]
    for name, row in report["apis"].items():
        label = "automatic choice" if name == "auto" else f"api={name!r}"
        if "error" in row:
            lines.append(f"{label}: unavailable: {row['error']}")
            continue
        where = f"simulator (target {row['target']})" if row["simulated"] else "real package"
        lines.append(f"{label}: {row['api']!r} on the {where}; a launch's LNC: {_text(row['lnc'])}")
    dev = report["torch_device_path"]
    if "error" in dev:
        lines.append(f"torch XLA device path: unknown: {dev['error']}")
    else:
        lines.append(f"torch XLA device path: {'available' if dev['available'] else 'unavailable'}"
                     f": {dev['reason']}")
    return "\n".join(lines)


def _text(value: Any) -> str:
    if isinstance(value, dict) and "error" in value:
        return f"error ({value['error']})"
    return "the legacy grid decides" if value is None else str(value)
