"""Every committed host (benchmarks/hosts/<label>/) predicted again from its own profile,
probe only: a change to the prediction model that breaks a host you are not on fails here.

Targets (the prediction issue): >= 95 % of sweep points within +-20 %, median
|measured / predicted - 1| <= 7 %, the 105m / 206m pair and the 10B pick within +-15 %.
"""

from __future__ import annotations

import json

import pytest

from tern.measure.hosts import (
    accuracy_report,
    hosts_root,
    load_hosts,
    region_of,
    render_hosts_report,
    repeatability,
    repredict,
    save_host,
)

HOSTS = load_hosts()
WITHIN_SHARE = 0.95
MEDIAN_ABS_ERR = 0.07
NAMED_WITHIN = 0.15  # 105m, 206m and the 10B pick
SLACK = 0.02  # a floor may move this much with float noise of a refactor, no more

# Hosts on which the probe-only model does not meet the targets yet, with the accuracy of
# their sweep points when committed (share within +-20 %, median |error|): the target test
# is a strict xfail there (it fails as soon as the model meets the targets: then remove
# the entry), and no change may make them worse than these figures.
KNOWN_MISSES: dict[str, tuple[float, float, str]] = {
    # the Intel Xeon VM with numba compiling for SSE4.2 (session 13): the plain ternary path
    # is compute-bound there (82 ps per weight, 11x the AVX-512 kernel) and its 1-thread
    # points from 7.5 MiB up run at 0.77-0.92x their predictions (30m-e64-k8 0.77) while the
    # host's kernel speed timed beside each point was 1.03x the probe's; 2 threads: median 4.8 %
    "intel-xeon-amx-sse42": (0.92, 0.088, "Intel SSE4.2 build: 1-thread points 0.77-0.92x, cause not found"),
    # the same build re-measured in session 31 (code a54b282, a 279 s probe with numba compiling for Nehalem, no
    # repeat sweep): 48 / 50 within, median 7.7 % (1 thread 5.9 %, 2 threads 9.9 %; the 2-thread points from 30 MiB
    # to 140 MiB at 0.82-0.87x, the 1-thread 30m-e64-k16 0.72x while the read rate and kernel speed timed beside it
    # were 1.00 / 1.00x the probe's); 105m / 206m within 4 %; cause not found
    "intel-xeon-amx-sse42-s31": (0.96, 0.077, "Intel SSE4.2 build, session 31: median 7.7 %, cause not found"),
    # and again in session 33 (code c23cc4a, the first SSE4.2 profile with row-length curves, no repeat sweep): 47 / 50
    # within, median 8.2 % (1 thread 12.4 %, 2 threads 5.6 %); the same 1-thread 30m-e64 points miss (k4 / k8 / k16
    # 0.74 / 0.76 / 0.73x). Its plain 4-row pass computes at ~300 ps a byte in cache and stalls about as long again
    # from DRAM (1.6 GB/s at 1 thread), 4 KiB rows 0.44x as long as 256 B rows (its row curves); 105m / 206m
    # 1.09 / 1.02, the pick 0.99 / 0.89
    "intel-xeon-amx-sse42-s33": (0.94, 0.082, "Intel SSE4.2 build, session 33: 1-thread 30m-e64 points 0.73-0.76x"),
    # the same Intel Xeon VM re-measured with session 15's engine (int8 routers read as int8,
    # one-pass top-k, faster activation quantizer), fresh probe: 1 thread 25/25 within, median
    # 5.6 %; 2 threads 22/25, median 12.9 %, the small models' points slower than predicted
    # (4m-e74 0.67, 30m-e14 0.72). Its probe fitted a region phase at 1.19 us (fit error 19 %)
    # where the first commit of this host fitted 1.69, with no read or kernel drift beside the
    # points (median ratios 0.98-1.02): the phase cost of this VM is not stable between probes
    # Since session 19 every row is predicted at the mean context its runs decoded (64 tokens
    # from a reset: 33 positions, was a full window of 128): faster predictions, so the
    # small models' 2-thread points that already ran slower than predicted miss more
    # (47 -> 45 of its 50 sweep points within +-20 %, median |error| 11.1 -> 11.7 %)
    "intel-xeon-amx-s15": (0.90, 0.117, "Intel, session 15 engine: 2-thread points 12.9 % median, region phase fit"),
    # the same VM, session 19's engine (router split, masked-code row dot), fresh probe and
    # sweep: 44 / 50 within, median 8.6 %; the 1-thread DRAM-bound points run 1.07-1.26x
    # their predictions and most 2-thread ones 0.82-0.96x. The probe's DRAM points of the
    # 4-row pass's curves are not stable between processes here: 1024 x 1024 matrices over
    # 512 MiB read at 9.2 GB/s in this probe, 10.6 and 17.0 in two curve-only re-runs the
    # same hour (its engine decodes the 10B pick as if at ~12-16), so the stall is overpriced
    "intel-xeon-amx-s19": (0.88, 0.086, "Intel, session 19 engine: 1-thread DRAM points 1.07-1.26x, unstable DRAM curve"),
    # the AMD EPYC Zen 4 VM again (session 20, same CPU model as amd-epyc-zen4, which is
    # 50/50 within): 32/50 within, median 14.7 %, measured/predicted 0.72-1.42 both ways.
    # The host itself did not hold still: a second sweep of the same points with the same
    # code and profile 20 minutes later (sweep_repeat.jsonl) agreed with the first at only
    # 63 % of the points within +-20 % (41 % within +-10 %; second / first 0.59-1.76), and
    # the read rate / kernel speed timed beside the points were off the probe's by > 15 % at
    # 29 of 56 points. Its two probes 30 minutes apart read DRAM at 29.9 / 24.9 GB/s (1
    # thread) and 56.0 / 32.5 (2 threads). No prediction can meet +-20 % at 95 % of points
    # on a host whose own repeat meets it at 63 % (test_noisy_host_misses_are_its_own_spread)
    # Since session 31 the chosen experts' items at 2 threads are priced at the 1-thread engine-context factor
    # (tern.predict.roofline.expert_items_seconds): this host's 1-thread factor is 0.90 against 1.45 at 2 threads
    # (its slow second-vCPU band), so its 2-thread MoE points moved the wrong way: 30 -> 29 / 50 within, median
    # 14.7 -> 16.9 %; the steady Intel hosts s30 / s31 went 48 -> 50 and 49 -> 50 / 50
    "amd-epyc-zen4-s20": (0.58, 0.17, "AMD Zen 4, session 20: the host's own repeat sweep is 63 % within +-20 %"),
    # the same AMD Zen 4 VM a third time (session 22, commit cc846b1's engine, fresh probe):
    # 41 / 50 within, median 9.3 % (1 thread 22 / 25, 2 threads 19 / 25), measured/predicted
    # 0.70-1.51 both ways. Again the host moved under the sweep: its repeat sweep agreed with
    # the first at 74 % of the points within +-20 % (35 % within +-10 %; second / first
    # 0.72-1.52), and the kernel speed timed beside the points ran at a median 0.85 of the
    # probe's, off by > 15 % at 25 of 50 points
    "amd-epyc-zen4-s22": (0.82, 0.093, "AMD Zen 4, session 22: the host's own repeat sweep is 74 % within +-20 %"),
    # and a fourth time (session 23, the engine with the probe's streaming-prefetch choice, off
    # at both thread counts then): 30 / 50 within, median 15.9 % — 1 thread 21 / 25 (median
    # 10.7 %), 2 threads 9 / 25 (24.3 %), the 2-thread points at a median 1.24x their
    # predictions. Its repeat sweep twenty minutes later put the same 2-thread points at a
    # median 1.06x (1 thread 1.06x) and agreed with the first at 74 % within +-20 % (50 % within
    # +-10 %; second / first 0.63-1.42); the read rate / kernel speed beside the points were
    # off the probe's by > 15 % at 25 of 50. Its probe read DRAM at 27.2 / 47.6 GB/s (1 / 2
    # threads; session 22's: 27 / 31)
    "amd-epyc-zen4-s23": (0.60, 0.159, "AMD Zen 4, session 23: the host's own repeat sweep is 74 % within +-20 %"),
    # the same VM again after session 23's skip-kernel change (whole rows prefetched into L2; the probe chose the
    # streaming kernel without prefetch at both thread counts): 39 / 50 within, median 9.5 % — 1 thread 24 / 25
    # (median 4.2 %: the targets met), 2 threads 15 / 25 (13.2 %). Not noise alone: the 2-thread points ran at a
    # median 0.87x their predictions in the sweep and 0.90x in its repeat (4m-e36 / e2676 0.54 / 0.53 in the
    # first, 0.82 / 0.84 in the repeat; 30m-e455 0.71 / 0.72 in both), so the one-region step's 2-thread work is
    # priced too fast on this host; the repeat agreed with the first at 83 % within +-20 % (80 % within +-10 %)
    "amd-epyc-zen4-s23b": (0.78, 0.095, "AMD Zen 4, session 23 skip change: 2-thread points 0.87x, 1 thread 24/25"),
    # session 24 on the same VM, after the row passes' prefetch into L2 and the probe's stream / 4-row choice (the
    # 4-row pass at 1 thread, the stream at 2): 41 / 50 within, median 5.4 % — 1 thread 25 / 25 (median 3.4 %: the
    # targets met), 2 threads 16 / 25 (9.7 %, a median 0.91x): the 4m family at 2 threads ran at 0.61-0.74x, as in
    # s23b (the one-region step's 2-thread work priced too fast on this host); the repeat sweep agreed with the
    # first at 78 % within +-20 % (70 % within +-10 %)
    "amd-epyc-zen4-s24": (0.82, 0.054, "AMD Zen 4, session 24: 2-thread points 0.91x (4m 0.61-0.74x), 1 thread 25/25"),
    # session 26 on the same VM with session 25's engine (c429d37; "+dirty" in host.json: docs only): 42 / 50
    # within, median 6.4 %. Two causes, both seen in its repeat sweep too (87 % within +-20 % of the first):
    # (1) an engine regression the predictor does not price: session 25 made the int8 router call
    # matvec_fp32_nb once per ROW, so the 4m models with 313-2,676 experts (int8 routers of up to 2,676 rows)
    # ran 0.50-0.77x their 1-thread predictions (s24: 0.82-0.95); the next commit calls the row dot inline
    # (kernels_stored._router_int8: 4m-e2676 2,440 -> 3,988 tok/s at 1 thread, same run); (2) the VM's slow
    # 2-thread band: 105m / 206m at 2 threads 0.70 / 0.62x, the kernel speed beside them 0.84-0.86 of the probe's
    "amd-epyc-zen4-s26": (0.84, 0.065, "AMD Zen 4, session 26: the int8 router regression of session 25, 2-thread band"),
    # the same VM after that fix (code c3ed456, 02:32-03:29 UTC): 29 / 50 within, median 15.7 % - 1 thread 25 / 25
    # (median 12.2 %, every point 0.87-1.19x), 2 threads 4 / 25 (55.8 %, 0.95-1.83x). The sweep itself ran as s26's
    # did (same points, measured tok/s within a few % of s26's at most points; its repeat agreed with it at 85 %
    # within +-20 %): the probe priced it slow. Its engine runs (tern.probe.engine_runs) put the engine-context
    # factor at 1.33 / 2.35 (1 / 2 threads; s26: 1.07 / 1.34, s24: 1.15 / 1.27): at 2 threads both context models
    # ran 139 / 188 us a token (s26: 85 / 130; re-timed in session 27: 86-94 / 130-141, medians of 8 processes), the VM's
    # slow band caught in a ~1 s window; at 1 thread probe-ctx-b (d_model 384, every matvec ending in a partial
    # 256-column segment) was priced 118 us where s26 priced it 166, the op costs' tail term having moved 5.5 ->
    # 1.0 ns a row between the two probes
    "amd-epyc-zen4-s26b": (0.58, 0.157, "AMD Zen 4, session 26 after the fix: engine runs in a slow band (factor 2.35 at 2 threads)"),
    # session 27 on the same VM, the first probe with engine runs in rounds (code d294482, 04:52-05:06 UTC): 36 / 50
    # within, median 5.6 % - 1 thread 23 / 25 (median 4.3 %, median ratio 1.00; its repeat sweep 24 / 25, 5.2 %), 2
    # threads 13 / 25 (19.7 %, median ratio 0.80; repeat 20 / 25, 0.85). The VM's second core was in its slow band
    # all session: the probe read DRAM at 28.3 / 30.6 GB/s (1 / 2 threads; s26 30.6 / 63.2) and its engine runs'
    # three rounds spread 34-49 % (2 threads: probe-ctx-a 83 -> 124 us a token); the fastest round prices the fast
    # band (4m-e1 at 2 threads predicted 10,715 tok/s; measured 10,528 in s26's sweep, 6,460 in this one). The
    # repeat agreed with the first sweep at 85 % within +-20 % (63 % within +-10 %; second / first 0.51-1.57)
    "amd-epyc-zen4-s27": (0.72, 0.056, "AMD Zen 4, session 27: 1 thread 23/25 (4.3 %), 2-thread points in the VM's slow band"),
    # session 28, same VM, after the 4-row pass's 128-column tail stopped spilling through the stack (code b4d2e9d,
    # 09:13-09:30 UTC): 34 / 50 within, median 8.2 % - 1 thread 23 / 25 (median 5.3 %, median ratio 0.95), 2 threads
    # 11 / 25 (29.5 %, median ratio 0.71): the second core in its slow band again (the probe's 2-thread engine-run
    # rounds spread 44-66 %, its fastest pricing the fast band). The op costs' partial-segment term came out 1.0 ns a
    # row, now the only value the pass can give. The repeat agreed with the first sweep at 65 % within +-20 %
    "amd-epyc-zen4-s28": (0.68, 0.082, "AMD Zen 4, session 28: 1 thread 23/25 (5.3 %), 2-thread points in the VM's slow band"),
    # session 37, same VM, after session 36's attention split from d_model 256 (code 6f21d90, 08:07-08:21 UTC): 46 / 50
    # within, median 4.6 % - 1 thread 25 / 25 (median 5.2 %), 2 threads 21 / 25 (3.8 %). The four misses are 2-thread
    # DRAM-bound points at 0.67-0.79x: 30m-e228, 4m-e640 and 30m-e64-k4 with the threads near (62-68 ns) while the
    # read rate timed just before each ran 1.10-1.14x the probe's (the host drifting: 16 of 56 points), 4m-e1309 with
    # the threads far apart (310 ns). Probe: DRAM 27.4 / 33.1 GB/s (1 / 2 threads)
    "amd-epyc-zen4-s37": (0.92, 0.046, "AMD Zen 4, session 37: 1 thread 25/25 (5.2 %), four 2-thread DRAM-bound points drifted"),
    # session 38, same VM, after int8 rows went into L2 and the int8 router dequantized in its row dot (code 6824b04,
    # 12:08-12:17 UTC): 42 / 50 within, median 10.0 % - 1 thread 22 / 25 (8.0 %), 2 threads 20 / 25 (13.0 %). The probe
    # read DRAM at 27.9 / 32.4 GB/s (2 threads only 1.16x one); the sweep ran slower than the probe at most points (the
    # 4m family at 1 thread 0.74-0.95x, measured 0.76-1.02x of session 37's tok/s at the same points, its two
    # 1,309- / 2,676-expert models 1.02 / 1.28x: their int8 routers), the worst 30m-e64-k8 / -k4 at 2 threads 0.60 /
    # 0.68x with the read rate timed before them 1.10 / 1.13x the probe's and the kernel 1.06x
    "amd-epyc-zen4-s38": (0.84, 0.100, "AMD Zen 4, session 38: 1 thread 22/25 (8.0 %), 2 threads 20/25 (13.0 %), the sweep slower than its probe"),
    # session 39, same VM, the same engine re-measured with a repeat sweep (code 56fd4c7, 14:55-15:15 UTC): 46 / 50 within,
    # median 8.1 % - 1 thread 25 / 25 (8.3 %), 2 threads 21 / 25 (6.4 %). The misses are 2-thread points at 0.59-0.77x
    # with the threads near (66-68 ns): 4m-e1 (the kernel timed before it 0.90x the probe's), 4m-e2676, 30m-e455 and
    # 30m-e64-k1 (0.84 / 0.83x). The repeat sweep agreed with the first at 83 % of its points within +-20 % (second /
    # first 0.71-1.61). Probe: DRAM 30.2 / 35.8 GB/s (1 / 2 threads)
    "amd-epyc-zen4-s39": (0.92, 0.081, "AMD Zen 4, session 39: four 2-thread points 0.59-0.77x; its repeat sweep 83 % within +-20 %"),
    # the same VM an hour later with numba compiling for Haswell (AVX2 only; code 690abc4, 09:09-09:26 UTC): 46 / 50
    # within, median 4.1 % - 1 thread 25 / 25 (2.8 %), 2 threads 21 / 25 (6.3 %); the misses are the 4m family's
    # cache-resident 2-thread points at 0.66-0.74x, e3 / e8 / e17 with the threads far apart (323-327 ns), e1 near
    # (69 ns). Probe: DRAM 34.0 / 65.4 GB/s (1 / 2 threads; the native probe an hour before read 27.4 / 33.1)
    # session 43, same VM, the first engine with layout "auto" = blocked16 (code 9dc34a8, the pools' b3 rule edited
    # during the run: "+dirty"; 01:33-01:54 UTC): 37 / 50 within, median 12.2 % - 1 thread 23 / 25 (median 4.4 %; the
    # misses 4m-e74 / 4m-e1309 at 0.71 / 0.72x), 2 threads 14 / 25 (16.9 %, a median 1.15x: priced slow). The probe's
    # context models gained nothing from a second thread with the blocked pass (89 / 97 / 70 us a token at 1 thread,
    # 91 / 97 / 65 at 2; with the 4-row pass in s39 119 / 135 / 95 -> 86 / 95 / 62), so its 2-thread engine-context
    # factor came out 1.26 against 0.88 at 1 thread (s39: 1.29 / 1.22) and scales the larger models' 2-thread compute by
    # it. A second probe 25 minutes later priced the same rows slower still (2 threads 5 / 28 within, a median 1.34x).
    # Pricing a per-phase cost instead of the factor at 2 threads (fitted from the same engine runs) was tried: s43 37 ->
    # 40 / 50, but amd-epyc-zen4-avx2 / s23b / s26 / s27 / intel-xeon-amx-s15 lost points, so it was not kept. The repeat
    # sweep agreed with the first at 80 % within +-20 % (57 % within +-10 %; second / first 0.63-1.63)
    "amd-epyc-zen4-s43": (0.74, 0.122, "AMD Zen 4, session 43 (blocked16): 1 thread 23/25 (4.4 %), 2-thread points priced 1.15x slow"),
    # session 44, same VM, the scan's dt projection in column blocks and the skip kernel's fixed cost cut (code b13c95d,
    # 06:03-06:15 UTC): 46 / 50 within, median 8.8 % - 1 thread 23 / 25 (6.0 %; 4m-e8 / 4m-e313 at 0.75 / 0.72x), 2
    # threads 23 / 25 (11.3 %, a median 1.02x: the 2-thread pricing of s43 did not recur; 4m-e36 0.63x, 4m-e1309 1.20x).
    # Its repeat sweep agreed with the first at 69 % within +-20 % (second / first 0.64-1.76). A fresh clone's
    # ./go report 20 minutes earlier, its own probe, met the targets: 48 / 50 within, median 6.5 %
    "amd-epyc-zen4-s44": (0.92, 0.088, "AMD Zen 4, session 44: 1 thread 23/25 (6.0 %), 2 threads 23/25 (11.3 %); 4m points"),
    "amd-epyc-zen4-avx2-s37": (0.92, 0.042, "AMD Zen 4 compiled for AVX2, session 37: four 4m 2-thread points, 3 of them far"),
    # the AMD EPYC Zen 5 VM again (family 26 model 2, session 49, code ef17120, 18:48-19:10 UTC; its first measure since
    # session 8): 36 / 50 within, median 11.7 %, measured / predicted 0.88 at the median - 1 thread 27 / 28 within (all
    # 56 points' split) but a median 0.91x: the 4m family 0.80-0.91x (the probe's d256 engine run took 1.69x its op-cost
    # compute, the other two 1.25 / 1.27, whose median prices every model), 105m 0.79x; 2 threads 14 / 28, median 19.4 %,
    # 4m-e2676 / e1309 / e3 0.27 / 0.46 / 0.49x with the host's kernel speed 0.67-0.88x its probe's beside them. The repeat
    # sweep agreed with the first at 78 % within +-20 % (second / first 0.67-2.61; 4m-e2676 at 2 threads 2,621 -> 6,842
    # tok/s) and met 40 / 54 of the predictions, median 11.8 %
    "amd-epyc-zen5-s49": (0.72, 0.117, "AMD Zen 5, session 49: 1 thread 0.91x at the median (4m 0.80-0.91x), 2 threads 14/28"),
    # the same VM an hour later with the skip kernel's branch-free listing (code 217bd4c, 20:01-20:19 UTC): 43 / 50
    # within, median 11.6 %, measured / predicted 1.06 at the median - 1 thread 24 / 28, 2 threads 23 / 28 (8.3 %). Its
    # probe caught the VM slow: the kernel speed timed beside the points ran a median 1.42x the probe's (48 of 50 points
    # drifted past +-15 %), and the sweep's first four 1-thread points (4m-e1 .. e17, 0.61-0.70x) ran while the read rate
    # was 0.80-0.88x. Its repeat sweep agreed with the first at 76 % within +-20 % and met 45 / 54 predictions (11.5 %)
    "amd-epyc-zen5-s49b": (0.86, 0.116, "AMD Zen 5, session 49 after the skip listing: a slow probe (kernels 1.42x it in the sweep)"),
    # the AMD EPYC Zen 4 VM again (family 25 model 17, session 50, code e164c0f with the session's disk plan of run_sweep
    # uncommitted: nothing measured or predicted changed; 21:43-22:03 UTC): 43 / 50 within, median 7.1 % - 1 thread 20 / 25
    # (8.2 %, 0.92x at the median), 2 threads 23 / 25 (4.7 %). The misses are the sweep's first 1-thread points (4m-e1 /
    # e8 / e17 0.78 / 0.78 / 0.58x, 30m-e3 / e6 0.76 / 0.68x) and 30m-e64-k4 / k16 at 2 threads (1.20 / 1.21x). Its repeat
    # sweep agreed with the first at 91 % within +-20 % (second / first 0.75-1.53; 4m-e17 at 1 thread 8,062 -> 12,336
    # tok/s) and met 50 / 50 of the predictions, median 6.2 %. Rebuilding a model right before its point (scratch, 3 rounds
    # of 3 models) did not slow the point: 0.96-1.04x of the same model measured from disk
    "amd-epyc-zen4-s50": (0.86, 0.072, "AMD Zen 4, session 50: the sweep's first 1-thread points 0.58-0.78x; its repeat 50/50"),
    # the same VM half an hour later with the skip kernel's listing priced (code 4d729f7, 22:14-22:33 UTC): 38 / 50 within,
    # median 10.3 % - 1 thread 23 / 25 (10.0 %, 0.96x at the median; without the listing term 0.94x, 8.3 %: the 4m points
    # move up to 0.87-0.96x, the 30m ones, already above 1, to 1.04-1.33x), 2 threads 15 / 25 (19.2 %, 0.81x). Its probe
    # read DRAM at 55.6 GB/s with 2 threads (the Zen 4 VM's earlier probes 32-38), and the read rate timed beside the
    # 2-thread DRAM-bound points ran 0.50-0.64x that; its repeat sweep agreed with the first at only 61 % within +-20 %
    "amd-epyc-zen4-s50b": (0.76, 0.104, "AMD Zen 4, session 50 (listing priced): probe's 2-thread DRAM read 55.6 GB/s, 0.5-0.64x it beside the points"),
    # session 51, the same VM (code be1a193, the kernel curves sampled in rounds; 01:12-01:31 UTC): 36 / 50 within, median
    # 13.4 % - 1 thread 21 / 25 (6.7 %, 0.93x at the median), 2 threads 15 / 25 (14.7 %, 0.85x), the worst three
    # 2-thread cache-resident 4m points at 0.67-0.70x with the threads near (68-73 ns). Its probe's 2-thread engine runs
    # moved 63-83 % between their three rounds (each keeps its fastest, at 66 ns; the rounds' threads 69 / 30 / 66 ns
    # apart) and its repeat sweep agreed with the first at only 76 % within +-20 % (0.74-1.48x)
    "amd-epyc-zen4-s51": (0.70, 0.134, "AMD Zen 4, session 51: 2-thread engine runs 63-83 % apart between rounds; its repeat sweep 76 %"),
    # none at present. amd-epyc-zen5 (native) was 90 % within with the two-shape curves and
    # passes since its re-measure with the row-heavy third shape (session 7);
    # amd-epyc-zen5-sse42 was 47/50, median 9.1 % (every DRAM-bound point slow: the plain
    # skip kernel, 30 % of those models' time, stayed scalar) and is 49/50, 4.1 % since that
    # kernel vectorises (session 8, re-measured).
}
# Named models (105m, 206m, the 10B pick) off by more than 15 %: (label, name, threads) ->
# the |measured / predicted - 1| when committed.
NAMED_MISSES: dict[tuple[str, str, int], float] = {
    # the 10B picks committed before the two-size kernel curves (DRAM-bound, 24 layers of
    # 8 / 4 experts of 512 x 1024): the engine streams their small experts slower than the
    # one-size curves say (measured 81 / 109 tok/s, predicted 101 / 148 on the native host)
    ("amd-epyc-zen4-avx2", "d1024-L24-E256k4-h512", 2): 0.190,
    # the Intel SSE4.2 build (above): 105m at 1 thread measured 244 tok/s, predicted 206
    # (205 since the probe's engine runs are priced at the context they decoded, session 19,
    # which raised this build's engine-context factor: 105m / 206m at 2 threads went from
    # 1.149 / 1.140 to 1.153 / 1.154 of their predictions)
    ("intel-xeon-amx-sse42", "105m", 1): 0.194,
    ("intel-xeon-amx-sse42", "105m", 2): 0.153,
    ("intel-xeon-amx-sse42", "206m", 2): 0.154,
    # the SSE4.2 build in session 31 (above): its 10B pick d1024-L12-E512k1-h512 (top-1 of 512 experts of 512 x 1024;
    # predicted to miss 100 tok/s, and it does) measured 88.2 / 149.5 tok/s against 61.6 / 104.5 predicted; of the
    # predicted 16.2 ms a token at 1 thread, 5.2 are the resident pool's DRAM stall added to 7.3 of ternary compute:
    # whether this slow plain kernel hides that stall was not measured. Fifteen minutes later the same worker
    # (python -m tern.measure.sweep_worker, 1 thread, 5 x 64 tokens) gave 51.8 / 50.6 / 44.4 tok/s, below the
    # prediction, while the native build's pick ran 116.5 against 133.0 at its commit: on this VM the SSE4.2 build's
    # L3-bound pass moves with the neighbours far more than the native one (its curve doubles from 8 to 64 MiB)
    ("intel-xeon-amx-sse42-s31", "d1024-L12-E512k1-h512", 1): 0.432,
    ("intel-xeon-amx-sse42-s31", "d1024-L12-E512k1-h512", 2): 0.430,
    # the Intel VM with session 15's engine (above): 206m at 2 threads measured 2,047 tok/s,
    # predicted 2,452
    ("intel-xeon-amx-s15", "206m", 2): 0.165,
    # the Intel VM with session 19's engine (above): the 10B pick at 1 thread measured
    # 146.9 tok/s, predicted 118.3 (its DRAM stall priced from the slow curve)
    ("intel-xeon-amx-s19", "d1024-L24-E256k2-h512", 1): 0.241,
    # the Intel VM in session 36 after the attention split from d_model 256: its 10B pick d2560-L8-E128k1-h1280
    # (485M active, top-1 of 128 experts) at 2 threads measured 230.6 tok/s against 191.7 predicted (1 thread
    # 114.2 / 117.3). That token read 37.9 GB/s end to end, the probe's 2-thread DRAM rate (38.2), where the
    # engine's DRAM-bound kernels reach ~75 % of it: its 145 MB resident pool sits at the edge of the L3 slice
    # this probe measured (134 MiB at 1 thread; the 2-thread curve still read 45-50 GB/s at 128-152 MiB), and a
    # share of it stayed in L3 from token to token. The predictor prices a pool past the slice from DRAM
    ("intel-xeon-amx-s36b", "d2560-L8-E128k1-h1280", 2): 0.203,
    # the noisy AMD Zen 4 VM of session 20 (above): in its repeat sweep 206m ran 1,296 and
    # 2,252 tok/s (1 / 2 threads) against 1,841 and 1,661 in the first; 105m at 2 threads
    # 2,249 against 1,813. The 10B pick decoded 96-126 tok/s at 1 thread in six separate
    # processes that hour (predicted 116.3) and 85.6 in the sweep
    ("amd-epyc-zen4-s20", "206m", 1): 0.274,
    ("amd-epyc-zen4-s20", "105m", 2): 0.286,  # 0.252 before session 31 (above)
    ("amd-epyc-zen4-s20", "206m", 2): 0.253,  # 0.222
    ("amd-epyc-zen4-s20", "d1024-L24-E256k2-h512", 1): 0.264,
    ("amd-epyc-zen4-s20", "d1024-L24-E256k2-h512", 2): 0.199,  # 0.177
    # session 22 on the same VM (above): 206m at 2 threads measured 1,690 tok/s against 2,238
    # predicted, 105m 2,599 against 2,225; the 10B pick 143.8 / 125.9 tok/s (1 / 2 threads)
    # against 123.4 / 160.5 (slower at 2 threads than at 1 in that sweep)
    ("amd-epyc-zen4-s22", "206m", 2): 0.266,  # 0.245 before session 31; its 105m at 2 threads 0.168 -> 0.136
    ("amd-epyc-zen4-s22", "d1024-L24-E256k2-h512", 1): 0.166,
    ("amd-epyc-zen4-s22", "d1024-L24-E256k2-h512", 2): 0.225,  # 0.215
    # session 23 on the same VM (above): 105m at 1 thread measured 1,680 tok/s against 2,054
    # predicted, 206m 1,668 against 1,952 (1 thread) and 2,251 against 2,666 (2 threads)
    ("amd-epyc-zen4-s23", "105m", 1): 0.182,
    ("amd-epyc-zen4-s23", "206m", 2): 0.156,
    # after the skip change (above): 206m at 1 thread measured 2,409 tok/s against 1,784 predicted (105m 1,985
    # against 1,897; in the repeat sweep 206m ran 1,921)
    ("amd-epyc-zen4-s23b", "206m", 1): 0.351,
    # session 24 (above): 105m at 1 thread measured 1,774 tok/s against 2,100 predicted (206m 2,197 against 2,026)
    ("amd-epyc-zen4-s24", "105m", 1): 0.155,
    # session 26 (above): 105m / 206m at 2 threads measured 2,017 / 1,756 tok/s against 2,874 / 2,830 (repeat
    # sweep 1,876 / 1,961); the 10B pick at 2 threads 179.6 against 222.2 (127.1 against 137.6 at 1 thread)
    ("amd-epyc-zen4-s26", "105m", 2): 0.298,
    ("amd-epyc-zen4-s26", "206m", 2): 0.379,
    ("amd-epyc-zen4-s26", "d2560-L8-E256k4-h640", 2): 0.192,
    # s26b (above): 105m 1,836 / 2,681 tok/s (1 / 2 threads) against 2,411 / 2,138, 206m at 2 threads 2,643 against
    # 2,111; the 10B pick (d1024-L24-E128k4-h1024, 500M active) 145.0 / 196.6 against 128.0 / 129.4
    ("amd-epyc-zen4-s26b", "105m", 1): 0.239,
    ("amd-epyc-zen4-s26b", "105m", 2): 0.254,
    ("amd-epyc-zen4-s26b", "206m", 2): 0.252,
    ("amd-epyc-zen4-s26b", "d1024-L24-E128k4-h1024", 2): 0.520,
    # s27 (above): 105m / 206m at 1 thread 2,177 / 1,814 tok/s against 2,681 / 2,490 (s26's profile predicted 2,206 /
    # 2,101 for the same speeds: its op costs fitted the partial-segment term of the ternary row pass at 5.5 ns a row,
    # this probe's at 1.0; d_model 384 ends every one of their matvecs in a partial segment), at 2 threads 2,665 /
    # 2,166 against 3,635 / 3,392; the 10B pick (d1024-L24-E128k4-h1024) at 2 threads 162.4 against 193.3
    ("amd-epyc-zen4-s27", "105m", 1): 0.188,
    ("amd-epyc-zen4-s27", "206m", 1): 0.271,
    ("amd-epyc-zen4-s27", "105m", 2): 0.267,
    ("amd-epyc-zen4-s27", "206m", 2): 0.361,
    ("amd-epyc-zen4-s27", "d1024-L24-E128k4-h1024", 2): 0.160,
    # s28 (above): 206m at 1 thread 2,262 tok/s against 2,668 (105m 2,527 against 2,739, within: the pair's 10 % drop
    # past the 32 MiB L3 is priced at 3 %); at 2 threads 2,220 / 2,221 against 3,689 / 3,597 (the slow band); the 10B
    # pick (d2560-L8-E64k1-h2560, 563M active) at 2 threads 172.5 against 147.9 (at 1 thread 134.8 against 139.1)
    ("amd-epyc-zen4-s28", "206m", 1): 0.152,
    ("amd-epyc-zen4-s28", "105m", 2): 0.398,
    ("amd-epyc-zen4-s28", "206m", 2): 0.383,
    ("amd-epyc-zen4-s28", "d2560-L8-E64k1-h2560", 2): 0.166,
    # session 37's Zen 4 VM: 105m at 1 thread 2,238 against 2,710 tok/s (its five samples 1,997-2,424: the read rate
    # 1.07x the probe's), and its 10B pick d2560-L8-E256k4-h640 (179 MB active) at 1 thread 100.4 against 126.5; re-run
    # in the same hour 111.9 (sweep point) and 117.5 (op_breakdown.py: its SSM scan 1.37 ms a token where the
    # predictor prices 0.62 - its 7 layers' fp32 dt projections, 23 MB of the token's 179 MB, read from DRAM)
    ("amd-epyc-zen4-s37", "105m", 1): 0.174,
    ("amd-epyc-zen4-s37", "d2560-L8-E256k4-h640", 1): 0.206,
    # session 38's Zen 4 VM: 105m at 2 threads 2,292 against 2,783 tok/s; its 10B pick d2560-L8-E256k4-h640 (dt in
    # fp16, 567M active) at 2 threads 136.9 against 110.9 (at 1 thread 119.7 against 113.6): the probe's 2-thread DRAM
    # rate (32.4 GB/s) prices it slow
    ("amd-epyc-zen4-s38", "105m", 2): 0.176,
    ("amd-epyc-zen4-s38", "d2560-L8-E256k4-h640", 2): 0.234,
    # session 39's Zen 4 VM: 105m at 2 threads 3,200 against 3,854 tok/s; its 10B pick d2560-L8-E128k2-h1280 (564M
    # active, dt in fp16) at 1 thread 142.0 against 99.8 and at 2 threads 204.2 against 154.6. At 1 thread the engine
    # ran its 4-row pass on the 640 B rows (the probe's long-row choice, x1.19 over the stream), whose DRAM stall the
    # predictor prices at 26 ps a byte: the curves stage's 13.8 on 256 B rows times the row stage's 640 / 256 B ratio
    # (1.92), where the row stage itself measured 7.1 ps on 256 B rows and 13.8 on 640 B (benchmarks/README.md)
    ("amd-epyc-zen4-s39", "105m", 2): 0.170,
    ("amd-epyc-zen4-s39", "d2560-L8-E128k2-h1280", 1): 0.423,
    ("amd-epyc-zen4-s39", "d2560-L8-E128k2-h1280", 2): 0.321,
    # session 43's Zen 4 VM (blocked16, above): 206m at 2 threads 2,230 tok/s against 3,208 (its repeat sweep: 0.63-1.63x
    # the first's points); its 10B pick d2560-L8-E256k8-h640 (724M active, 208 MB a token) at 2 threads 139.8 against 114.6
    # (1 thread 114.3 against 116.1: within 2 %)
    ("amd-epyc-zen4-s43", "206m", 2): 0.305,
    ("amd-epyc-zen4-s43", "d2560-L8-E256k8-h640", 2): 0.220,
    # session 44's (above): 105m / 206m at 2 threads 4,277 / 4,015 tok/s against 3,168 / 2,953 (threads 321 / 69 ns
    # apart; at 1 thread 0.95 / 0.94x); its 10B pick within 4 % at both thread counts (120.3 / 115.6, 149.1 / 149.7)
    ("amd-epyc-zen4-s44", "105m", 2): 0.350,
    ("amd-epyc-zen4-s44", "206m", 2): 0.360,
    # session 49's Zen 5 VM (above): 105m at 1 / 2 threads 3,867 / 4,522 tok/s against 4,917 / 5,353 (its repeat sweep
    # 4,147 / 3,796); the 10B pick d1024-L24-E128k8-h1024 at 1 thread 99.4 against 119.8 (2 threads 153.2 against 168.8)
    ("amd-epyc-zen5-s49", "105m", 1): 0.214,
    ("amd-epyc-zen5-s49", "105m", 2): 0.155,
    ("amd-epyc-zen5-s49", "d1024-L24-E128k8-h1024", 1): 0.170,
    # s49b (above): 105m / 206m at 2 threads 5,062 / 4,964 tok/s against 4,203 / 4,031 (1 thread 0.85 / 0.89x); its 10B
    # pick, the same d1024-L24-E128k8-h1024, 115.6 / 167.7 tok/s against 115.1 / 158.1: within 1 / 6 %
    ("amd-epyc-zen5-s49b", "105m", 2): 0.205,
    ("amd-epyc-zen5-s49b", "206m", 2): 0.231,
    # session 50's Zen 4 VM (above): its 10B pick d2560-L8-E256k8-h640 at 2 threads 193.1 tok/s against 134.1 (1 thread
    # 130.1 against 126.1): its probe read DRAM at 37.8 GB/s with 2 threads (runs 21.8-48.1), and the read rate timed
    # right before the point was 2.11x the probe's at its working set
    ("amd-epyc-zen4-s50", "d2560-L8-E256k8-h640", 2): 0.440,
    # s50b (above): 105m / 206m at 1 thread 3,311 / 3,315 tok/s against 4,392 / 4,153, 105m at 2 threads 2,901 against
    # 4,969; its 10B pick d2560-L8-E128k4-h1280 at 2 threads 150.7 against 207.5 with the read rate beside it 0.55x the
    # probe's (1 thread 120.8 against 115.1: within 5 %)
    ("amd-epyc-zen4-s50b", "105m", 1): 0.246,
    ("amd-epyc-zen4-s50b", "206m", 1): 0.202,
    ("amd-epyc-zen4-s50b", "105m", 2): 0.416,
    ("amd-epyc-zen4-s50b", "d2560-L8-E128k4-h1280", 2): 0.274,
    # s51 (above): 105m at 1 thread 3,550 tok/s against 4,329 (the read rate beside it 1.32x the probe's); its 10B pick
    # d2560-L8-E64k2-h2560 at 2 threads 117.7 against 155.2 (1 thread 112.5 against 114.7: within 2 %)
    ("amd-epyc-zen4-s51", "105m", 1): 0.180,
    ("amd-epyc-zen4-s51", "d2560-L8-E64k2-h2560", 2): 0.241,
    # (the Intel Xeon VM in session 30: its 10B pick at 2 threads, measured 227.3 tok/s against 195.2, was a named
    # miss here until session 31 priced the chosen experts' items at the 1-thread engine-context factor: 213.0 now)
}


def _sweep_report(host):
    pts = repredict(host.rows, host.profile)
    return accuracy_report([p for p in pts if p["family"] in ("fixed_active", "fixed_total")])


def _named_points():
    out = []
    for h in HOSTS:
        for p in repredict(h.rows, h.profile):
            if p["family"] in ("preset", "10b"):
                out.append((h.label, p))
    return out


def test_hosts_are_committed():
    assert hosts_root() is not None and hosts_root().is_dir() and HOSTS, "benchmarks/hosts/ holds no committed host"
    for h in HOSTS:
        assert h.profile.op_costs and h.profile.op_curves and h.profile.engine_runs, \
            f"{h.label}: profile without op costs / kernel curves / engine runs"
        assert len(h.rows) >= 20, f"{h.label}: only {len(h.rows)} measured points"
        assert {int(r["threads"]) for r in h.rows} >= {1, 2}, h.label
    assert set(KNOWN_MISSES) <= {h.label for h in HOSTS}


@pytest.mark.parametrize("host", [
    pytest.param(h, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[h.label][2]))
    if h.label in KNOWN_MISSES else h for h in HOSTS], ids=[h.label for h in HOSTS])
def test_probe_only_prediction_meets_the_targets(host):
    rep = _sweep_report(host)
    worst = ", ".join(f"{w['name']} t{w['threads']} {w['ratio']:.2f}" for w in rep["worst"])
    assert rep["within_20pct"] >= WITHIN_SHARE, (host.label, rep["within_20pct"], worst)
    assert rep["median_abs_err"] <= MEDIAN_ABS_ERR, (host.label, rep["median_abs_err"], worst)


@pytest.mark.parametrize("host", HOSTS, ids=[h.label for h in HOSTS])
def test_no_committed_host_gets_worse(host):
    within, median, _ = KNOWN_MISSES.get(host.label, (WITHIN_SHARE, MEDIAN_ABS_ERR, ""))
    rep = _sweep_report(host)
    assert rep["within_20pct"] >= within - SLACK, (host.label, rep["within_20pct"], within)
    assert rep["median_abs_err"] <= median + SLACK, (host.label, rep["median_abs_err"], median)


NAMED = _named_points()


@pytest.mark.parametrize("label,point", [
    pytest.param(lab, p, marks=pytest.mark.xfail(strict=True, reason="committed as a known miss"))
    if (lab, p["name"], p["threads"]) in NAMED_MISSES else (lab, p) for lab, p in NAMED],
    ids=[f"{lab}-{p['name']}-t{p['threads']}" for lab, p in NAMED])
def test_named_models_within_15_percent(label, point):
    assert abs(point["ratio"] - 1) <= NAMED_WITHIN, (label, point["name"], point["threads"], point["ratio"])


def test_noisy_host_misses_are_its_own_spread():
    """A known miss blamed on the host's own spread carries a repeat sweep that shows it: the
    host agreed with itself at fewer points than the target asks of predictions. A host whose
    repeat sweep agrees with its first is held to the targets (no known-miss entry)."""
    spread = {h.label: repeatability(h.rows, h.repeat_rows) for h in HOSTS if h.repeat_rows}
    noisy = [lab for lab, r in spread.items() if r["within_20pct"] < WITHIN_SHARE]
    assert noisy == ["amd-epyc-zen4-s20", "amd-epyc-zen4-s22", "amd-epyc-zen4-s23", "amd-epyc-zen4-s23b",
                     "amd-epyc-zen4-s24", "amd-epyc-zen4-s26", "amd-epyc-zen4-s26b", "amd-epyc-zen4-s27",
                     "amd-epyc-zen4-s28", "amd-epyc-zen4-s39", "amd-epyc-zen4-s43", "amd-epyc-zen4-s44", "amd-epyc-zen4-s50",
                     "amd-epyc-zen4-s50b", "amd-epyc-zen4-s51",
                     "amd-epyc-zen5-s49",
                     "amd-epyc-zen5-s49b"]
    for lab in noisy:
        assert spread[lab]["n"] >= 50 and lab in KNOWN_MISSES, (lab, spread[lab])
    steady = [lab for lab in spread if lab not in noisy]
    # their repeats: 54 points each, 100 % within +-20 % of the first sweep
    assert steady == ["intel-xeon-amx-s30", "intel-xeon-amx-s31"]
    assert not set(steady) & set(KNOWN_MISSES)


def test_every_named_miss_is_a_committed_point():
    # a host re-measured (or relabelled) leaves no stale entry behind
    assert set(NAMED_MISSES) <= {(lab, p["name"], p["threads"]) for lab, p in NAMED}


def test_named_misses_do_not_get_worse():
    for lab, p in NAMED:
        ceiling = NAMED_MISSES.get((lab, p["name"], p["threads"]), NAMED_WITHIN)
        assert abs(p["ratio"] - 1) <= ceiling + SLACK, (lab, p["name"], p["threads"], p["ratio"], ceiling)


def test_regions_follow_the_measured_last_cache_tier():
    llc = 32 << 20
    assert region_of(1 << 20, llc) == "cache-resident"
    assert region_of(40 << 20, llc) == "cache edge"
    assert region_of(65 << 20, llc) == "DRAM-bound"
    assert region_of(1 << 20, 0) == "DRAM-bound"  # no cache tier measured


def test_accuracy_report_on_hand_made_points():
    pts = [{"name": n, "threads": 1, "ratio": r, "region": reg}
           for n, r, reg in (("a", 1.0, "cache-resident"), ("b", 1.1, "cache-resident"),
                             ("c", 0.7, "DRAM-bound"), ("d", 1.25, "cache edge"))]
    rep = accuracy_report(pts, worst=2)
    assert rep["n"] == 4 and rep["within_20pct"] == pytest.approx(0.5)
    assert rep["median_abs_err"] == pytest.approx(0.175)  # |errors| 0, 0.1, 0.25, 0.3
    assert [w["name"] for w in rep["worst"]] == ["c", "d"]
    assert rep["by_region"]["cache-resident"]["within_20pct"] == 1.0
    assert rep["by_region"]["DRAM-bound"]["within_20pct"] == 0.0


def test_save_host_keeps_measurements_not_predictions(tmp_path):
    h = HOSTS[0]
    rows = [dict(r, kind="sweep_point", predicted_tok_per_s=1.0, ratio=9.9) for r in h.rows[:3]]
    rows.append({"kind": "calibration", "x": 1})
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    folder = save_host("some-host", hosts_root() / h.label / "host_profile.json", src, root=tmp_path / "hosts")
    back = load_hosts(tmp_path / "hosts")
    assert [b.label for b in back] == ["some-host"] and folder.name == "some-host"
    assert len(back[0].rows) == 3 and all("ratio" not in r and "predicted_tok_per_s" not in r for r in back[0].rows)
    assert back[0].profile == h.profile and back[0].repeat_rows == ()
    with pytest.raises(ValueError):
        save_host("../escape", hosts_root() / h.label / "host_profile.json", src, root=tmp_path)
    # a repeat sweep of the same points is kept beside them, and read back as the host's spread
    again = [dict(r, tok_per_s=r["tok_per_s"] * f) for r, f in zip(rows[:3], (1.05, 0.7, 1.5), strict=True)]
    save_host("some-host", hosts_root() / h.label / "host_profile.json", src, root=tmp_path / "hosts",
              repeat_rows=again)
    back = load_hosts(tmp_path / "hosts")[0]
    assert len(back.repeat_rows) == 3 and not list((tmp_path / "hosts" / "some-host").glob(".*.tmp"))
    with pytest.raises(ValueError, match="no sweep_point"):
        save_host("other", hosts_root() / h.label / "host_profile.json", src, root=tmp_path / "hosts",
                  repeat_rows=[{"kind": "calibration"}])


def test_repeatability_on_hand_made_sweeps():
    first = [{"name": n, "threads": t, "tok_per_s": v} for n, t, v in
             (("a", 1, 100.0), ("b", 1, 100.0), ("c", 2, 100.0), ("d", 2, 100.0))]
    second = [{"name": n, "threads": t, "tok_per_s": v} for n, t, v in
              (("a", 1, 105.0), ("b", 1, 85.0), ("c", 2, 150.0), ("e", 1, 1.0))]  # e: not in the first
    r = repeatability(first, second)
    assert r["n"] == 3 and r["within_10pct"] == pytest.approx(1 / 3) and r["within_20pct"] == pytest.approx(2 / 3)
    assert (r["min_ratio"], r["median_ratio"], r["max_ratio"]) == (0.85, 1.05, 1.5)
    assert repeatability(first, [{"name": "a", "threads": 2, "tok_per_s": 1.0}]) is None  # other threads


def test_rows_are_predicted_with_the_engine_policy_they_were_measured_under():
    """A row without ``engine_policy`` was measured by an engine that split matrices from 1M
    weights (tern.kernels.policy.LEGACY_POLICY); a row measured by an engine that split from
    64K says so, and re-predicts as that engine ran."""
    from tern.kernels.policy import LEGACY_POLICY, EnginePolicy

    host = next(h for h in HOSTS if h.label == "amd-epyc-zen5")
    row = next(r for r in host.rows if r["name"] == "sweep-4m-e1" and int(r["threads"]) == 2)
    assert "engine_policy" not in row
    legacy = repredict([row], host.profile)[0]["predicted_tok_per_s"]
    assert repredict([{**row, "engine_policy": LEGACY_POLICY.to_dict()}], host.profile)[0][
        "predicted_tok_per_s"] == legacy
    low = {**row, "engine_policy": EnginePolicy(par_min_weights=1 << 16).to_dict()}
    now = repredict([low], host.profile)[0]["predicted_tok_per_s"]
    assert abs(now / legacy - 1) > 0.01, (now, legacy)


def test_drift_of_the_host_is_reported_beside_the_verdict():
    from tern.measure.hosts import drift_summary, verdict_text

    def pts(ratios, reads, kernels=None):
        kernels = kernels or [None] * len(ratios)
        return [{"name": f"p{i}", "threads": 1, "ratio": r, "region": "DRAM-bound", "host_read_ratio": h,
                 "host_kernel_ratio": k} for i, (r, h, k) in enumerate(zip(ratios, reads, kernels, strict=True))]

    steady = pts([1.0, 1.05, 0.97, 1.02, 0.99], [1.0, 0.95, 1.1, 1.02, 0.9])
    rep = accuracy_report(steady)
    assert rep["host_drift"]["drifted"] == 0 and "drifted" not in verdict_text(rep)
    # 2 of 5 points read 40 % slower than at the probe, and those are the ones that miss
    moved = pts([1.0, 1.05, 0.6, 1.02, 0.62], [1.0, 0.95, 0.6, 1.02, 0.6])
    d = drift_summary(moved)
    assert d == {"n": 5, "median_read_ratio": pytest.approx(0.95), "median_kernel_ratio": None, "drifted": 2,
                 "within_20pct_steady": 1.0}
    text = verdict_text(accuracy_report(moved))
    assert "MISSES" in text and "The host drifted: at 2 of 5 points" in text and "100 % are within" in text
    assert "read rate 0.95x" in text and "kernel speed" not in text.split("medians:")[1]
    # memory reads as at the probe, but the cores run 30 % slower at 3 of 5 points
    slow_cores = pts([0.7, 0.72, 0.7, 1.0, 1.01], [1.0] * 5, [0.7, 0.7, 0.69, 1.0, 0.98])
    d = drift_summary(slow_cores)
    assert d["drifted"] == 3 and d["median_kernel_ratio"] == pytest.approx(0.7) and d["within_20pct_steady"] == 1.0
    assert "kernel speed 0.70x" in verdict_text(accuracy_report(slow_cores))
    assert drift_summary([{"ratio": 1.0}]) is None  # rows measured before the host was timed beside them
    assert accuracy_report([{"name": "a", "threads": 1, "ratio": 1.0, "region": "DRAM-bound"}])["host_drift"] is None


def test_a_measured_row_is_predicted_at_the_context_it_decoded():
    """A sweep row decodes ``tokens`` from a reset: it is re-predicted at their mean context,
    which for a model with attention is faster than at a full window (and a row without
    ``tokens`` still prices a full window)."""
    from tern.core.config import ModelConfig
    from tern.measure.sweep import predicted
    from tern.predict.roofline import predict, synthetic_profile

    host = synthetic_profile(1 << 20, 100.0, 20.0)
    cfg = ModelConfig(name="tiny", vocab_size=16, d_model=8, n_layers=2, attn_layers=(1,), n_heads=2,
                      attn_window=4096)
    row = {"name": "x", "family": "fixed_active", "threads": 1, "tok_per_s": 1.0, "config": cfg.to_dict()}
    full = repredict([row], host)[0]["predicted_tok_per_s"]
    short = repredict([{**row, "tokens": 8}], host)[0]["predicted_tok_per_s"]
    assert short > full
    assert short == pytest.approx(predict(cfg, host, 1, context=5).tok_per_s)  # (1 + ... + 8) / 8 = 4.5 -> 5
    assert predicted(cfg, host, 1, tokens=8)["predicted_tok_per_s"] == pytest.approx(short)
    assert predicted(cfg, host, 1)["predicted_tok_per_s"] == pytest.approx(full)


def test_a_site_install_has_no_committed_hosts_and_plots_this_machine_alone(monkeypatch):
    """What notebook 06 meets in a wheel install (Colab / Kaggle; tests/report/test_wheel_install
    does not run it there, for time): no checkout, so no committed hosts, and the hosts figure
    draws the machine's own points as its one panel."""
    import tern.measure.hosts as hosts_mod
    from tern.measure.plots_hosts import plot_hosts

    monkeypatch.setattr(hosts_mod, "repo_root", lambda: None)
    assert hosts_mod.hosts_root() is None and load_hosts() == []
    here = repredict(HOSTS[0].rows, HOSTS[0].profile)
    fig = plot_hosts({"this machine (now)": here, **{h.label: repredict(h.rows, h.profile) for h in load_hosts()}})
    drawn = [ax for ax in fig.axes if ax.lines or ax.collections]
    assert len(drawn) == 1 and "this machine" in drawn[0].get_title()


def test_two_thread_points_are_split_by_where_the_threads_sat():
    # two 2-thread points measured with the threads near (cores sharing a cache), two far
    # apart, one with no round trip recorded (older rows), and a 1-thread point (never split)
    pts = [{"name": n, "threads": t, "ratio": r, "region": "cache-resident", "core_round_trip_ns": ns}
           for n, t, r, ns in (("a", 2, 1.02, 64.0), ("b", 2, 0.95, 70.0), ("c", 2, 0.70, 350.0),
                               ("d", 2, 0.90, 360.0), ("e", 2, 0.5, None), ("f", 1, 1.0, 400.0))]
    rep = accuracy_report(pts)
    near, far = rep["by_placement"]["near"], rep["by_placement"]["far"]
    assert near["n"] == 2 and near["within_20pct"] == 1.0 and near["median_round_trip_ns"] == pytest.approx(67.0)
    assert far["n"] == 2 and far["within_20pct"] == pytest.approx(0.5)
    assert far["median_abs_err"] == pytest.approx(0.2) and far["median_round_trip_ns"] == pytest.approx(355.0)
    text = render_hosts_report({"h": {"meta": {"cpu": "x"}, "probe_only": rep}})
    assert "near threads" in text and "far threads" in text and "(round trip 355 ns)" in text
    assert "worst: e t2 ratio 0.500 (cache-resident)" in text  # no round trip: nothing invented
    assert "worst: c t2 ratio 0.700 (cache-resident, threads 350 ns apart)" in text
    # only near points: no far side; none with a round trip: no split at all
    assert set(accuracy_report(pts[:2])["by_placement"]) == {"near"}
    assert accuracy_report(pts[4:])["by_placement"] is None
