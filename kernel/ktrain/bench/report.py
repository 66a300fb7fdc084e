"""The report of ``ktrain bench`` as the command prints it."""

from __future__ import annotations

from typing import Any

from ktrain.bench.device import DeviceState


def _fmt_gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _fmt_ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.1f}"


def describe_report(report: dict[str, Any]) -> str:
    """The report as the command prints it."""
    f = report["formula"]
    tokens = report["micro_batch_size"] * report["sequence_len"] * report["gradient_accumulation_steps"]
    tokens = report.get("tokens_per_step") or tokens * report["data_parallel"]  # pairs: two sequences a row
    ranks = report["ranks"]
    where = report["device"] if ranks == 1 else f"{ranks} ranks of {report['device']} ({report['mesh']})"
    peak = f"{report['peak_tflops']:g} TFLOP/s" if report["peak_tflops"] else None
    frozen = f" - 2 x {f['frozen_params']:,} of them frozen (no weight gradient)" if f["frozen_params"] else ""
    lines = [
        f"ktrain bench {report['config']} on {where} (ktrain {report['versions']['ktrain']}, "
        f"torch {report['versions']['torch']}, transformers {report['versions']['transformers']})",
        f"plugins beside the kernel's: {', '.join(report['plugins']) or 'none'}",
        f"rows: {report['rows']}; micro batch {report['micro_batch_size']} x sequence {report['sequence_len']} "
        f"x accumulation {report['gradient_accumulation_steps']}"
        + (f" x {report['data_parallel']} data-parallel ranks" if report["data_parallel"] > 1 else "")
        + f" = {tokens:,} tokens a step; "
        f"{report['warmup_steps']} warm-up + {report['timed_steps']} timed steps",
        f"MFU = tokens/s x FLOPs a token / peak; FLOPs a token = 6 x {f['non_embedding_params']:,} parameters "
        f"outside the embeddings{frozen} + 12 x {f['layers']} layers x {f['hidden']} hidden "
        f"x {f['sequence_len']} sequence "
        f"= {f['flops_per_token']:.4g}; peak " + (peak or "unknown for this device: no MFU (set KTRAIN_PEAK_TFLOPS)"),
        "",
        f"{'':44} {'tokens/s':>10} {'MFU':>6} {'peak GiB':>9} {'step ms':>9} {'data ms':>8} {'fwd+bwd ms':>10} "
        f"{'optim ms':>9} {'loss@1':>7} {'padding':>7}",
    ]
    for side in (report["ktrain"], report["peer"]):
        if side is None:
            continue
        mfu = f"{side['mfu']:.1%}" if side["mfu"] is not None else "n/a"
        split = side["split_s"] or {}  # None: the peer's log splits no step (Axolotl)
        lines.append(
            f"{side['name'][:44]:44} {side['tokens_per_s']:>10,.0f} {mfu:>6} {_fmt_gib(side['peak_memory_gib']):>9} "
            f"{side['step_s'] * 1e3:>9.1f} {_fmt_ms(split.get('data')):>8} "
            f"{_fmt_ms(split.get('forward_backward')):>10} "
            f"{_fmt_ms(split.get('optimizer')):>9} {side['first_loss']:>7.3f} {side['padding']:>7.1%}"
        )
    lines.append("tokens/s counts the samples' tokens; padding is the share of the computed positions that are padding")
    if report.get("pairs_per_step"):  # --pairs: a pair's tokens are both its sequences'
        per_pair = tokens / report["pairs_per_step"]
        sides = (("ktrain", report["ktrain"]), ("peer", report["peer"]))
        rates = [f"{name} {side['tokens_per_s'] / per_pair:,.1f}" for name, side in sides if side]
        lines.append(f"pairs/s ({per_pair:,.0f} tokens a pair): " + ", ".join(rates))
    for name, side in (("ktrain", report["ktrain"]), ("peer", report["peer"])):
        for done in (side or {}).get("passes") or ():  # before the first step: not in tokens/s above
            rate = done["items"] / done["seconds"] if done["seconds"] > 0 else float("nan")
            lines.append(
                f"{name} before training, not in tokens/s: {done['name']} of {done['items']:,} {done['unit']} in "
                f"{done['seconds']:.2f} s ({rate:,.1f} {done['unit']}/s)"
            )
    if report.get("peer_setup"):
        lines.append(f"peer: {report['peer_setup']}")
    lines.extend(f"Axolotl's YAML: {difference}" for difference in report.get("peer_differences", []))
    if report.get("fp8_peak_tflops"):
        lines.append(
            f"fp8: MFU {report['ktrain']['mfu_fp8_peak']:.1%} against the dense FP8 peak "
            f"({report['fp8_peak_tflops']:g} TFLOP/s); the MFU column is against the bf16 peak, as for every run"
        )
    if ranks > 1:
        per_device = report["ktrain"]["tokens_per_s_per_device"]
        lines.append(f"{ranks} ranks: {per_device:,.0f} tokens/s per device; MFU against all {ranks} devices' peaks")
    if report["ratio"] is not None:
        lines.append(f"ktrain / peer: {report['ratio']:.2f}x tokens/s")
    lines.extend(_describe_device_states(report))
    lines.extend(_describe_collections(report))
    if report["device"] == "CPU":
        lines.append("peak memory: n/a on a CPU (the GPU's max_memory_allocated on a GPU)")
    return "\n".join(lines)


def _describe_device_states(report: dict[str, Any]) -> list[str]:
    """What the GPU did while each side was timed (rank 0's GPU), or why that was not read."""
    if report["device"] == "CPU":
        return []
    missing = report["device_state_missing"]
    if missing:
        return [f"device clock and power: not read ({missing})"]
    sides = [side for side in (report["ktrain"], report["peer"]) if side and side["device_state"]]
    return [
        f"device while timed, {side['name'].split(':')[0]}: {DeviceState(**side['device_state']).describe()}"
        for side in sides
    ]


def _describe_collections(report: dict[str, Any]) -> list[str]:
    """The host's garbage collections while each side was timed (a pass is a pause of the host)."""
    lines = []
    for side in (report["ktrain"], report["peer"]):
        done = (side or {}).get("collections")
        if done:
            lines.append(
                f"host while timed, {side['name'].split(':')[0]}: {done['passes']:,} garbage collector passes "
                f"({done['oldest']} over the oldest generation), {done['seconds'] * 1e3:,.1f} ms in all"
            )
    return lines
