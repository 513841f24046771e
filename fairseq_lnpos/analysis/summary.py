"""Means and spreads over seeds of the per-model records of init_grad; the layout of fig3.json."""
import statistics

STACKS = ("encoder", "decoder")
PAPER = {
    "post_ln_last_w2": 1.6,
    "note": "Fig. 3c/d: Post-LN's last-layer W2 gradient norm stays around 1.6 for 6..14 layers; "
            "Pre-LN's decreases with depth. Lemma 2: Post-LN E||x^{post,5}||^2 = 1.5 d before every "
            "LN; Pre-LN (1 + l/2) d <= E||x_l||^2 <= (1 + 3l/2) d.",
}


def _mean_std(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _labels(records):
    seen = []
    for r in records:
        if r["label"] not in seen:
            seen.append(r["label"])
    return seen


def summarize(records, settings, depths, layers_depth, seeds, lemma2=True):
    """fig3.json's content from init_grad's per-model ``records``; the other values are the run's settings."""
    labels = _labels(records)
    per_layer, last_w2, ratio, lemma2_of = {}, {}, {}, {}
    for label in labels:
        mine = [r for r in records if r["label"] == label]
        full = [r for r in mine if r["full"]]
        if full:
            per_layer[label] = {}
            for stack in STACKS:
                per_layer[label][stack] = {}
                for w in ("fc1", "fc2"):
                    depth = full[0]["depth"]
                    entry = {"mean": [], "std": [], "batch_norm_mean": [], "seeds": len(full)}
                    for layer in range(depth):
                        m, s = _mean_std([r["mean_grad"][stack][w][layer] for r in full])
                        b, _ = _mean_std([r["batch_norm"][stack][w][layer] for r in full])
                        entry["mean"].append(m)
                        entry["std"].append(s)
                        entry["batch_norm_mean"].append(b)
                    per_layer[label][stack][w] = entry
        sweep = [r for r in mine if r["depth_requested"] is not None]
        measured = sorted({r["depth"] for r in sweep})
        if sweep:
            last_w2[label], ratio[label] = {}, {}
            for stack in STACKS:
                entry = {"depths": measured, "mean": [], "std": [], "batch_norm_mean": [], "seeds": []}
                for depth in measured:
                    at = [r for r in sweep if r["depth"] == depth]
                    m, s = _mean_std([r["mean_grad"][stack]["fc2"][depth - 1] for r in at])
                    b, _ = _mean_std([r["batch_norm"][stack]["fc2"][depth - 1] for r in at])
                    entry["mean"].append(m)
                    entry["std"].append(s)
                    entry["batch_norm_mean"].append(b)
                    entry["seeds"].append(len(at))
                last_w2[label][stack] = entry
                ratio[label][stack] = (
                    entry["mean"][-1] / entry["mean"][0] if len(measured) > 1 and entry["mean"][0] else None)
        with_lemma = [r for r in mine if r.get("lemma2")]
        if with_lemma:
            lemma2_of[label] = {stack: _lemma2(with_lemma, stack) for stack in STACKS}
    return {
        "paper": PAPER,
        "settings": dict(settings, archs=labels, depths=list(depths), layers_depth=layers_depth,
                         seeds=seeds, lemma2=lemma2),
        "per_layer": per_layer,
        "last_w2": last_w2,
        "ratio_last_w2": ratio,
        "lemma2": lemma2_of,
        "models": [{k: v for k, v in r.items() if k != "settings_key"} for r in records],
    }


def _lemma2(records, stack):
    points = records[0]["lemma2"][stack]
    depth = records[0]["depth"]
    pre = bool(records[0].get("normalize_before"))
    out = {"depth": depth, "normalize_before": pre, "points": []}
    for i, p in enumerate(points):
        m, s = _mean_std([r["lemma2"][stack][i]["sq_norm_over_d"] for r in records])
        out["points"].append({"layer": p["layer"], "ln": p["ln"], "mean": m, "std": s})
    if pre:
        # the stream entering layer l (l layers applied) is the input of its first LN; after the
        # last layer it is the input of the stack's final LN
        stream = [p for p in out["points"] if p["ln"] == "self_attn_ln"] + \
                 [p for p in out["points"] if p["ln"] == "final_ln"]
        x0 = stream[0]["mean"] if stream else None
        ls = list(range(len(stream)))
        out["stream"] = {
            "layers_applied": ls, "mean": [p["mean"] for p in stream],
            "lemma_lower": [1 + l / 2 for l in ls], "lemma_upper": [1 + 1.5 * l for l in ls],
            "lower_from_x0": [x0 + l / 2 for l in ls], "upper_from_x0": [x0 + 1.5 * l for l in ls],
        }
    else:
        ffn = [p["mean"] for p in out["points"] if p["ln"] == "ffn_ln"]
        out["before_ffn_ln"] = {"mean": ffn, "lemma": 1.5}
    return out


def headline(result):
    lines = []
    for label, stacks in result["last_w2"].items():
        for stack, e in stacks.items():
            vals = ", ".join(f"{d}: {m:.3f}±{s:.3f}" for d, m, s in zip(e["depths"], e["mean"], e["std"]))
            r = result["ratio_last_w2"][label][stack]
            rtxt = f"; {e['depths'][-1]}/{e['depths'][0]} ratio {r:.2f}" if r is not None else ""
            lines.append(f"{label:>10} {stack} last-layer W2 grad norm by depth: {vals}{rtxt}")
    for label, stacks in result["lemma2"].items():
        for stack, e in stacks.items():
            if "stream" in e:
                s = e["stream"]["mean"]
                lines.append(f"{label:>10} {stack} Lemma 2: ||x_l||^2/d from {s[0]:.2f} (l=0) to "
                             f"{s[-1]:.2f} (l={len(s) - 1}); lemma bounds at l={len(s) - 1}: "
                             f"[{e['stream']['lemma_lower'][-1]:.1f}, {e['stream']['lemma_upper'][-1]:.1f}]")
            elif e.get("before_ffn_ln", {}).get("mean"):
                v = e["before_ffn_ln"]["mean"]
                lines.append(f"{label:>10} {stack} Lemma 2: ||x^(post,5)||^2/d before the FFN LNs "
                             f"{min(v):.2f}..{max(v):.2f} (lemma: 1.5)")
    return "\n".join(lines)


def _cell(m, s, n):
    return "–" if m is None else f"{m:.3f} (1 seed)" if n == 1 else f"{m:.3f} ± {s:.3f} (n={n})"


def markdown(result):
    """fig3.json's content as Markdown: the settings, Fig. 3c/d (the last layer's W2 by depth), Fig. 3a/b
    (every layer at the full depth) and Lemma 2, each number the mean ± sd over seeds."""
    st = result["settings"]
    init = st.get("init") or "fairseq-0.12"
    lines = ["# Fig. 3 and Lemma 2 at initialization", "",
             f"Data: {st.get('data_desc')}; model size {st.get('size') or 'base'}"
             + (f", width {st['width']}" if st.get("width") else "") + f", initialization {init}; "
             f"K = {st.get('batches')} batches of at most {st.get('tokens')} tokens, dropout {st.get('dropout')}, "
             f"seeds {st.get('seeds')} from {st.get('first_seed')}. Statistic: the Frobenius norm of the "
             "gradient averaged over the K batches (the paper's), mean ± sd over seeds."
             + (f" Time: {sum(m['seconds'] for m in result['models']):.0f} s measuring the {len(result['models'])} "
                "models (each model's own, summed; also when a rerun took them from its records)."
                if result["models"] and all(m.get("seconds") is not None for m in result["models"]) else ""),
             "", f"The paper: {result['paper']['note']}", ""]
    if result["last_w2"]:
        depths = sorted({d for stacks in result["last_w2"].values() for e in stacks.values() for d in e["depths"]})
        lines += ["## The last layer's W2 gradient norm by depth (Fig. 3c/d)", "",
                  "| architecture | stack | " + " | ".join(f"depth {d}" for d in depths) + " | deepest / shallowest |",
                  "|---|---|" + "---|" * (len(depths) + 1)]
        for label, stacks in result["last_w2"].items():
            for stack, e in stacks.items():
                at = dict(zip(e["depths"], zip(e["mean"], e["std"], e["seeds"])))
                r = result["ratio_last_w2"][label][stack]
                lines.append(f"| {label} | {stack} | " + " | ".join(_cell(*at[d]) if d in at else "" for d in depths)
                             + f" | {'–' if r is None else format(r, '.2f')} |")
        lines.append("")
    if result["per_layer"]:
        lines += [f"## Every layer's W1 and W2 gradient norm at depth {st.get('layers_depth')} (Fig. 3a/b)", "",
                  "| architecture | stack | weight | layer 1 → last (mean over seeds) |", "|---|---|---|---|"]
        for label, stacks in result["per_layer"].items():
            for stack, ws in stacks.items():
                for w, e in ws.items():
                    lines.append(f"| {label} | {stack} | {'W1' if w == 'fc1' else 'W2'} | "
                                 + ", ".join("–" if m is None else f"{m:.3f}" for m in e["mean"]) + " |")
        lines.append("")
    if result["lemma2"]:
        lines += ["## Lemma 2: ‖x‖² / d at the LayerNorms' inputs of the deepest model (eval mode)", "",
                  "| architecture | stack | measured | the lemma |", "|---|---|---|---|"]
        for label, stacks in result["lemma2"].items():
            for stack, e in stacks.items():
                if "stream" in e:
                    s = e["stream"]
                    lines.append(f"| {label} | {stack} | ‖x_l‖²/d from {s['mean'][0]:.2f} (l = 0) to {s['mean'][-1]:.2f} "
                                 f"(l = {s['layers_applied'][-1]}) | between {s['lemma_lower'][-1]:.1f} and "
                                 f"{s['lemma_upper'][-1]:.1f} at l = {s['layers_applied'][-1]} |")
                elif e.get("before_ffn_ln", {}).get("mean"):
                    v = e["before_ffn_ln"]["mean"]
                    lines.append(f"| {label} | {stack} | before the FFN LayerNorms {min(v):.2f} to {max(v):.2f} | 1.5 |")
        lines.append("")
    return "\n".join(lines)
