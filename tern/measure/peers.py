"""`tern bench peers`: tern's engine beside llama.cpp's ``llama-bench`` on models of the same
dimensions, as JSONL rows with the bandwidth each engine attains.

For each shape (:data:`SHAPES`) one ModelConfig describes both files: a random tern file
(tern.packed.writer.random_model) and a random llama-architecture GGUF
(tern.measure.peers_gguf: TQ2_0 body, or TQ1_0), both cached under
``<results>/models/peers`` by config hash. Each thread count runs tern's engine in its own
process (tern.measure.sweep_worker) and then ``llama-bench -p 0 -n TOKENS -t T -r R -o jsonl``;
each row has tok/s (median of the repeats, min, max, spread), the bytes one token reads
(tern: tern.core.config.param_counts' active bytes; llama.cpp: the GGUF tensors on the
active path), GB/s end to end (bytes per token x tok/s) and the fraction of the probe's read
bandwidth at the model's working set (tern.measure.utilisation; None without a profile).

Differences that remain between the pairs: tern's attention has no positional encoding
(llama.cpp applies RoPE to q and k) and llama.cpp's KV cache is f16 (tern's fp32); tern
reads fp16 tables and int8 routers as stored (``engine_bytes_per_token`` counts what it reads;
engines before EnginePolicy.router_int8 read int8 routers as an fp32 table).
A GQA shape (``n_kv_heads``) exists only in the GGUF: compare such rows per byte read.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tern.core.config import ModelConfig, get_preset, param_counts
from tern.core.engine_tuning import llc_bytes_here
from tern.core.host_caches import usable_cpus
from tern.core.host_profile import HostProfile
from tern.core.records import append_jsonl, run_metadata, summarize
from tern.kernels.policy import EnginePolicy
from tern.measure.peers_gguf import ensure_gguf, gguf_byte_counts, gguf_tensors
from tern.measure.peers_table import BLOCKED_ENGINE, PER_MATRIX_ENGINE, ROWS_ENGINE
from tern.measure.sweep import SweepPoint, ensure_model, measure_in_subprocess, predicted
from tern.measure.utilisation import decode_utilisation, engine_bytes_per_token
from tern.probe.bandwidth import ReadNow, read_reference
from tern.probe.core_latency import round_trip_ns
from tern.probe.placement import RoundTripNow

PEER_CONTEXT = 512  # tern's attention window: >= every context the benchmark reaches
HOW_TO_GET_LLAMA = ("llama-bench not found (give --llama-bench PATH or put it on PATH); measuring "
                    "tern alone. To build it from the llama-cpp-python source distribution: "
                    "pip download --no-deps --no-binary :all: llama-cpp-python -d /tmp/llama; unpack it; "
                    "in its vendor/llama.cpp run cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF "
                    "-DCMAKE_BUILD_TYPE=Release && cmake --build build -j --target llama-bench "
                    "(benchmarks/README.md)")

JSON_FIELDS = """\
  peers: bench, records, llama_bench (path or null), note, host (profile label or null), errors,
    rows: [{kind: peers, run_id, engine (tern | tern-per-matrix | llama.cpp; tern-region in rows before the region step was the default), shape, dims (d/layers/ffn/vocab),
      config, model_file, file_bytes, threads, tokens, repeats, warmup, total_params,
      active_params, bytes_per_token, working_set_bytes, engine_bytes_per_token (tern),
      tok_per_s (median), tok_per_s_min, tok_per_s_max, spread_rel, samples_tok_per_s,
      gbps_end_to_end, read_gbps_at_ws, bandwidth_fraction, bandwidth_note,
      read_same_run {gbps_median, gbps_min, gbps_best, working_set_bytes, threads, repeats},
      bandwidth_fraction_same_run (of read_same_run's median),
      host_activity {foreign_cpu_frac, steal_frac: shares of all CPUs' time meanwhile (Linux)},
      core_round_trip_ns (threads > 1: the threads' cache-line round trip timed just before; null: none),
      predicted_tok_per_s, predicted_model, ratio (measured / predicted: tern rows, with a host profile),
      gguf {body, n_kv_heads} and llama_cpp {binary, build_commit, build_number, label} (llama.cpp),
      host, cpu, versions, git_commit, timestamp}]"""


@dataclass(frozen=True)
class PeerShape:
    """A benchmark shape: tern's config, whether llama.cpp gets a GGUF of it, the GGUF's
    KV heads (None: as many as query heads) and whether ``--quick`` runs it."""

    name: str
    cfg: ModelConfig
    llama: bool = True
    n_kv_heads: int | None = None
    small: bool = False
    default: bool = True

    @property
    def dims(self) -> str:
        c = self.cfg
        ffn = f"{c.n_experts}x{c.expert_hidden} top-{c.top_k}" if c.moe_layers else c.mlp_hidden
        return f"{c.d_model}/{c.n_layers}/{ffn}/{c.vocab_size}"


def dense_shape(name: str, d: int, layers: int, ffn: int, vocab: int, heads: int) -> ModelConfig:
    """Every layer attention (window PEER_CONTEXT), dense SiLU gated MLP, ternary2 body,
    fp16 embedding and untied fp16 head."""
    return ModelConfig(name=f"peer-{name}", vocab_size=vocab, d_model=d, n_layers=layers,
                       attn_layers=tuple(range(layers)), n_heads=heads, attn_window=PEER_CONTEXT,
                       mlp_hidden=ffn, activation="silu", embed_format="fp16", head_format="fp16",
                       tie_embeddings=False, max_seq_len=PEER_CONTEXT)


_MOE = dense_shape("9.7b-moe", 1024, 12, 0, 4096, 16).replace(
    moe_layers=tuple(range(12)), n_experts=512, top_k=8, expert_hidden=512, router_format="fp16",
    embed_format="int8", head_format="int8")
_1B = dense_shape("1.1b", 2048, 22, 5632, 32000, 32)
SHAPES: dict[str, PeerShape] = {s.name: s for s in (
    PeerShape("5.6m", dense_shape("5.6m", 256, 6, 768, 1024, 4), small=True),
    PeerShape("28m", dense_shape("28m", 512, 8, 1536, 1024, 8), small=True),
    PeerShape("86m", dense_shape("86m", 768, 12, 2048, 1024, 12)),
    PeerShape("1.1b", _1B),
    PeerShape("9.7b-moe", _MOE),
    PeerShape("sandbox", get_preset("sandbox"), llama=False, small=True),
    # TinyLlama's grouped-query attention (32 query / 4 KV heads) in the GGUF only: per byte read
    PeerShape("1.1b-gqa4", _1B, n_kv_heads=4, default=False),
    # the smallest shape both engines take (TQ2_0 rows are 256-weight blocks): smoke runs
    PeerShape("tiny", dense_shape("tiny", 256, 2, 256, 256, 4), small=True, default=False),
)}


def select_shapes(names: list[str] | None = None, quick: bool = False) -> list[PeerShape]:
    """Shapes by name (a :data:`SHAPES` key or a tern preset, the latter measured by tern
    alone); default: every default shape, or the small ones with ``quick``."""
    if not names:
        return [s for s in SHAPES.values() if s.default and (s.small or not quick)]
    out = []
    for n in names:
        if n in SHAPES:
            out.append(SHAPES[n])
            continue
        try:
            out.append(PeerShape(n, get_preset(n), llama=False))
        except ValueError:
            raise ValueError(f"unknown peers shape {n!r}; shapes: {', '.join(SHAPES)} "
                             "(or a tern preset, measured by tern alone)") from None
    return out


# ---- llama-bench ------------------------------------------------------------------------------


def find_llama_bench(path: str | os.PathLike | None = None) -> Path | None:
    """``path`` (must exist, be executable and answer ``--help`` as llama-bench does) or
    ``llama-bench`` on PATH (checked alike), else None. ValueError names what is wrong, before
    anything is measured."""
    if path is not None:
        p = Path(path)
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise ValueError(f"--llama-bench {p}: not an executable file")
        return check_llama_bench(p)
    found = shutil.which("llama-bench")
    return check_llama_bench(Path(found)) if found else None


def check_llama_bench(binary: Path, timeout_s: float = 60) -> Path:
    """``binary`` if ``binary --help`` runs and prints llama-bench's usage, else ValueError
    (a file that cannot be executed, a program that fails or prints something else)."""
    try:
        r = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=timeout_s,
                           env=llama_env())
    except OSError as e:
        raise ValueError(f"llama-bench {binary}: cannot run it ({e.strerror or e})") from None
    except subprocess.TimeoutExpired:
        raise ValueError(f"llama-bench {binary}: '--help' did not return within {timeout_s:.0f} s") from None
    if r.returncode != 0 or "usage" not in (r.stdout + r.stderr).lower():
        raise ValueError(f"llama-bench {binary}: '--help' exited {r.returncode} without llama-bench's usage "
                         f"text; is it llama.cpp's llama-bench? ({(r.stderr or r.stdout)[-300:]!r})")
    return binary


def parse_llama_bench(stdout: str) -> dict[str, Any]:
    """The generation test of ``llama-bench -o jsonl`` output: tok/s per repeat and summary,
    the build and the model's size as llama.cpp counts them."""
    tests = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                tests.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    gen = [t for t in tests if t.get("n_gen", 0) > 0 and t.get("n_prompt", 0) == 0]
    if not gen:
        raise ValueError(f"llama-bench printed no generation test (-p 0 -n N) in its JSONL output: "
                         f"{stdout[-500:]!r}")
    t = gen[-1]
    samples = [float(x) for x in t.get("samples_ts") or []]
    if not samples:
        raise ValueError("llama-bench's JSONL row has no samples_ts")
    s = summarize(samples)
    return {"tok_per_s": s["median"], "tok_per_s_min": s["min"], "tok_per_s_max": s["max"],
            "spread_rel": s["spread_rel"], "repeats": s["repeats"], "samples_tok_per_s": samples,
            "build_commit": t.get("build_commit"), "build_number": t.get("build_number"),
            "n_threads": t.get("n_threads"), "cpu_info": t.get("cpu_info"),
            "model_size": t.get("model_size"), "model_n_params": t.get("model_n_params"),
            "n_gen": t.get("n_gen")}


def run_llama_bench(binary: Path, gguf: Path, threads: int, tokens: int, repeats: int,
                    timeout_s: float = 1800) -> dict[str, Any]:
    """One ``llama-bench`` run (its own warm-up, then ``repeats`` of ``tokens`` tokens)."""
    cmd = [str(binary), "-m", str(gguf), "-p", "0", "-n", str(tokens), "-t", str(threads),
           "-r", str(repeats), "-o", "jsonl"]
    env = llama_env()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except OSError as e:  # e.g. the binary went away or lost its execute bit mid-run
        raise RuntimeError(f"could not run llama-bench {binary}: {e.strerror or e}") from None
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench failed on {gguf.name} ({threads} threads, exit {r.returncode}):\n"
                           f"{r.stderr[-2000:]}")
    return {**parse_llama_bench(r.stdout), "command": " ".join(cmd),
            "gomp_spincount": env.get("GOMP_SPINCOUNT")}


def llama_env() -> dict[str, str]:
    """The environment llama-bench runs in: this process's, without the GOMP_SPINCOUNT that
    importing tern set for its own OpenMP pools (tern/__init__.py) — llama.cpp's OpenMP build
    loads the same libgomp and would inherit it — unless the user set it, as a user runs llama.cpp."""
    import tern

    env = dict(os.environ)
    if tern.USER_GOMP_SPINCOUNT is None:
        env.pop("GOMP_SPINCOUNT", None)
    return env


# ---- measuring --------------------------------------------------------------------------------

MeasureTern = Callable[[Path, SweepPoint], dict[str, Any]]
MeasureLlama = Callable[[Path, Path, int, int, int], dict[str, Any]]
_SUMMARY = ("tok_per_s", "tok_per_s_min", "tok_per_s_max", "spread_rel", "repeats", "samples_tok_per_s",
            "host_activity")


def _row(shape: PeerShape, engine: str, path: Path, threads: int, m: dict[str, Any], counts: dict[str, int],
         host: HostProfile | None, meta: dict[str, Any], read_now: dict[str, Any] | None = None) -> dict[str, Any]:
    row = {"kind": "peers", "engine": engine, "shape": shape.name, "dims": shape.dims,
           "config": shape.cfg.to_dict(), "model_file": str(path), "file_bytes": path.stat().st_size,
           **counts, **{k: m[k] for k in _SUMMARY if k in m}, **meta, "threads": threads}
    row.update(decode_utilisation(row["tok_per_s"], counts["bytes_per_token"], counts["working_set_bytes"],
                                  threads, host, read_now))
    return row


def tern_counts(cfg: ModelConfig) -> dict[str, int]:
    pc = param_counts(cfg)
    return {"total_params": pc.total.params, "active_params": pc.active.params,
            "bytes_per_token": pc.active.bytes, "working_set_bytes": pc.total.bytes,
            "engine_bytes_per_token": engine_bytes_per_token(cfg, llc_bytes=llc_bytes_here())}


def llama_counts(shape: PeerShape, body: str) -> dict[str, int]:
    c = gguf_byte_counts(shape.cfg, gguf_tensors(shape.cfg, body, shape.n_kv_heads))
    return {"total_params": c["total_params"], "active_params": c["active_params"],
            "bytes_per_token": c["active_bytes"], "working_set_bytes": c["total_bytes"]}


def cpu_snapshot() -> tuple[float, list[int], float] | None:
    """(wall s, /proc/stat cpu jiffies, reaped children's CPU s); None off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            jiffies = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter(), jiffies, ru.ru_utime + ru.ru_stime


def host_activity(before: tuple | None, after: tuple | None) -> dict[str, float]:
    """What else the machine did while a measurement ran in a child process: the share of
    all CPUs' time that other processes used (``foreign_cpu_frac``: busy jiffies minus the
    child's CPU time) and that the hypervisor stole (``steal_frac``). Empty off Linux."""
    if before is None or after is None or after[0] <= before[0]:
        return {}
    hz, ncpu = os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1  # /proc/stat sums every CPU
    d = [a - b for a, b in zip(after[1], before[1], strict=False)] + [0] * 8
    user, nice, system, idle, iowait, irq, softirq, steal = d[:8]
    busy = (user + nice + system + irq + softirq) / hz
    cpu_s = (after[0] - before[0]) * ncpu
    return {"foreign_cpu_frac": max(0.0, busy - (after[2] - before[2])) / cpu_s, "steal_frac": steal / hz / cpu_s}


def _prediction(cfg: ModelConfig, host: HostProfile | None, threads: int, m: dict[str, Any],
                tokens: int) -> dict[str, Any]:
    """The predictor's tok/s for a tern row (tern.measure.sweep.predicted: the engine that measured it,
    the run's mean context) and measured / predicted; nothing without a host profile."""
    if host is None or not host.bandwidth:
        return {}
    policy = EnginePolicy.of_record(m) if "engine_policy" in m else None
    p = predicted(cfg, host, threads, policy, tokens)
    return {"predicted_tok_per_s": p["predicted_tok_per_s"], "predicted_model": p["predicted_model"],
            "ratio": m["tok_per_s"] / p["predicted_tok_per_s"]}


def _measured(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    before = cpu_snapshot()
    m = fn(*args)
    return {**m, "host_activity": host_activity(before, cpu_snapshot())}


def run_peers(shapes: list[PeerShape], threads: list[int], results: str | Path = "results",
              tokens: int = 64, repeats: int = 3, warmup: int = 16, body: str = "TQ2_0",
              llama_bench: Path | None = None, llama_label: str | None = None,
              host: HostProfile | None = None, measure_tern: MeasureTern = measure_in_subprocess,
              measure_llama: MeasureLlama | None = None, progress: bool = True,
              read_now: ReadNow | None = read_reference, per_matrix: bool = False,
              round_trip_now: RoundTripNow | None = round_trip_ns, blocked: bool = False,
              rows_layout: bool = False) -> dict[str, Any]:
    """Measure every shape at every thread count with tern (and llama.cpp when
    ``llama_bench`` is given); rows are appended to ``<results>/bench/peers.jsonl``.
    tern rows run the engine's default (one parallel region per token at threads > 1);
    ``per_matrix``: at threads > 1 also a parallel region per large matrix
    (Engine(region=False): engine ``tern-per-matrix``); ``blocked``: also Engine(layout="blocked16")
    (engine ``tern-blocked16``); ``rows_layout``: also Engine(layout="rows") (engine ``tern-rows``, the
    layout before "auto" chose blocked16).
    ``read_now(working_set_bytes, threads)`` (None: skipped) times the read kernel right
    before each engine's run: the rows' ``bandwidth_fraction_same_run``; at threads > 1
    ``round_trip_now()`` (None: skipped) the threads' round trip: ``core_round_trip_ns``."""
    from tern.core.paths import results_dir

    if not threads or any(not isinstance(t, int) or t < 1 for t in threads):
        raise ValueError(f"threads must be integers >= 1, got {threads}")
    if not 1 <= tokens <= PEER_CONTEXT or repeats < 1 or warmup < 0:
        raise ValueError(f"need 1 <= tokens <= {PEER_CONTEXT}, repeats >= 1, warmup >= 0; "
                         f"got {tokens}, {repeats}, {warmup}")
    out = results_dir(results)
    models, records = out / "models" / "peers", out / "bench" / "peers.jsonl"
    measure_llama = measure_llama or run_llama_bench
    run_id = f"{run_metadata()['timestamp']}-{uuid.uuid4().hex[:8]}"
    note = "" if llama_bench else HOW_TO_GET_LLAMA
    rows: list[dict[str, Any]] = []
    errors: list[str] = []

    def trip(t: int) -> dict[str, Any]:  # where the threads sit right now (tern.probe.core_latency)
        return {"core_round_trip_ns": round_trip_now()} if t > 1 and round_trip_now is not None else {}

    for shape in shapes:
        _log(progress, f"peers {shape.name} ({shape.dims}): writing / finding the model files")
        tern_path = ensure_model(shape.cfg, models)
        gguf = ensure_gguf(shape.cfg, models, body, shape.n_kv_heads, progress) if (
            llama_bench and shape.llama) else None
        for t in threads:
            base = {"run_id": run_id, "tokens": tokens, "warmup": warmup}
            _log(progress, f"peers {shape.name}: tern, {t} thread(s)")
            counts = tern_counts(shape.cfg)
            ref = read_now(counts["working_set_bytes"], t) if read_now else None
            where = trip(t)
            m = _measured(measure_tern, tern_path, SweepPoint("peers", shape.name, shape.cfg, t, tokens, repeats,
                                                              warmup))
            rows.append(_row(shape, "tern", tern_path, t, m, counts, host,
                             {**run_metadata(t), **base, **where, "engine_settings": m.get("engine"),
                              **_prediction(shape.cfg, host, t, m, tokens)}, ref))
            append_jsonl(records, rows[-1])
            for engine, kw in (((PER_MATRIX_ENGINE, dict(region=False)),) if per_matrix and t > 1 else ()) + (
                    ((BLOCKED_ENGINE, dict(layout="blocked16")),) if blocked else ()) + (
                    ((ROWS_ENGINE, dict(layout="rows")),) if rows_layout else ()):
                _log(progress, f"peers {shape.name}: {engine}, {t} thread(s)")
                ref = read_now(counts["working_set_bytes"], t) if read_now else None
                where = trip(t)
                m = _measured(measure_tern, tern_path, SweepPoint("peers", shape.name, shape.cfg, t, tokens,
                                                                  repeats, warmup, **kw))
                rows.append(_row(shape, engine, tern_path, t, m, counts, host,
                                 {**run_metadata(t), **base, **where, "engine_settings": m.get("engine")}, ref))
                append_jsonl(records, rows[-1])
            if gguf is None:
                continue
            _log(progress, f"peers {shape.name}: llama.cpp, {t} thread(s)")
            counts = llama_counts(shape, body)
            ref = read_now(counts["working_set_bytes"], t) if read_now else None
            where = trip(t)
            try:
                lm = _measured(measure_llama, llama_bench, gguf, t, tokens, repeats)
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:  # the other rows still count
                errors.append(f"llama.cpp on {shape.name}, {t} thread(s): {e}")
                _log(True, errors[-1])
                continue
            lc = {"binary": str(llama_bench), "build_commit": lm.get("build_commit"),
                  "build_number": lm.get("build_number"), "label": llama_label,
                  "model_size": lm.get("model_size"), "command": lm.get("command"),
                  "gomp_spincount": lm.get("gomp_spincount")}  # None: libgomp's default, as a user runs it
            rows.append(_row(shape, "llama.cpp", gguf, t, lm, counts, host,
                             {**run_metadata(t), **base, **where, "llama_cpp": lc,
                              "gguf": {"body": body, "n_kv_heads": shape.n_kv_heads or shape.cfg.n_heads}}, ref))
            append_jsonl(records, rows[-1])
    return {"bench": "peers", "records": str(records), "llama_bench": str(llama_bench) if llama_bench else None,
            "note": note, "host": host.label if host else None, "rows": rows, "errors": errors}


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


# ---- `tern bench peers` -----------------------------------------------------------------------


def cli_configure_peers(p: Any) -> None:
    p.add_argument("--shapes", default=None,
                   help=f"comma-separated shapes (default: {', '.join(s.name for s in select_shapes())}; "
                        f"also {', '.join(n for n, s in SHAPES.items() if not s.default)} or any tern preset)")
    p.add_argument("--quick", action="store_true", help="only the small shapes")
    p.add_argument("--threads", type=int, nargs="+", default=None, help="thread counts (default: 1 and all cores)")
    p.add_argument("--tokens", type=int, default=64, help="generated tokens per repeat (default 64)")
    p.add_argument("--repeats", type=int, default=3, help="repeats per engine (default 3, median reported)")
    p.add_argument("--warmup", type=int, default=16, help="tern's warm-up tokens (llama-bench runs its own)")
    p.add_argument("--body", default="TQ2_0", choices=("TQ2_0", "TQ1_0"), help="GGUF type of the ternary matrices")
    p.add_argument("--llama-bench", default=None, help="llama.cpp's llama-bench (default: on PATH)")
    p.add_argument("--llama-label", default=None,
                   help="recorded with llama.cpp rows (e.g. its source when the build reports commit 'unknown')")
    p.add_argument("--no-llama", action="store_true", help="measure tern alone")
    p.add_argument("--per-matrix", action="store_true",
                   help="at threads > 1 also time tern with a parallel region per large matrix "
                        "(Engine(region=False)) beside its default one region per token: rows of engine "
                        "tern-per-matrix")
    p.add_argument("--blocked", action="store_true",
                   help="also time tern with its ternary matrices re-packed into 16-row blocks "
                        "(Engine(layout='blocked16')): rows of engine tern-blocked16")
    p.add_argument("--rows-layout", action="store_true",
                   help="also time tern with its ternary matrices read as stored, 4 rows a pass "
                        "(Engine(layout='rows'), the layout before blocked16 became the default): rows of engine tern-rows")
    p.add_argument("--no-read-reference", action="store_true",
                   help="skip the read-kernel timing before each engine run (bandwidth_fraction_same_run)")
    p.add_argument("--results", default="results", help="results folder (rows: <results>/bench/peers.jsonl)")
    p.add_argument("--host", default=None, help="host profile JSON (default: <results>/host_profile.json when present; a path given here must exist)")


def cli_run_peers(args: Any) -> dict[str, Any]:
    from tern.core.paths import results_dir

    shapes = select_shapes([s.strip() for s in args.shapes.split(",") if s.strip()] if args.shapes else None,
                           quick=args.quick)
    threads = args.threads or sorted({1, usable_cpus()})
    llama = None if args.no_llama else find_llama_bench(args.llama_bench)
    if llama is None and not args.no_llama:
        print(HOW_TO_GET_LLAMA, file=sys.stderr)
    host_path = Path(args.host) if args.host else results_dir(args.results) / "host_profile.json"
    if args.host and not host_path.is_file():  # a profile asked for by name must be there
        raise ValueError(f"--host {args.host}: no such host profile (run `tern probe --out {args.host}`, "
                         "or leave --host out for <results>/host_profile.json)")
    host = HostProfile.load(host_path) if host_path.exists() else None
    if host is None:
        print(f"no host profile at {host_path} (run `tern probe`): rows carry no bandwidth fraction",
              file=sys.stderr)
    res = run_peers(shapes, threads, args.results, tokens=args.tokens, repeats=args.repeats,
                    warmup=args.warmup, body=args.body, llama_bench=llama, llama_label=args.llama_label,
                    host=host, read_now=None if args.no_read_reference else read_reference,
                    per_matrix=args.per_matrix, blocked=args.blocked, rows_layout=args.rows_layout)
    if args.no_llama:
        res["note"] = "llama.cpp not measured (--no-llama)"
    return res
