"""Reference learner functions for the Lab 3 checker tests (the notebook solution, in plain Python)."""
import numpy as np

from course_lib.scheduling import StepPlan


def iteration_time(decodes, chunks, device):
    positions = len(decodes) + sum(k for k, c in chunks)
    attention = sum(decodes) + sum(k * c + k * (k + 1) // 2 for k, c in chunks)
    context = sum(decodes) + sum(c for k, c in chunks)
    memory_s = (device.weights + device.kv * context) / device.bandwidth
    compute_s = (2 * device.n_matmul * positions + 4 * device.n_layers * device.d_model * attention) / device.compute
    return max(memory_s, compute_s)


def schedule_step(running, queue, device, budget=256, max_running=256):
    seqs = list(running)
    used = sum(filled for filled, target in seqs)
    admitted = 0
    for prompt, generated in queue:
        cost = prompt + generated
        if len(seqs) >= max_running or (used + cost) * device.kv > 0.99 * device.memory:
            break
        seqs.append((0, cost))
        used += cost
        admitted += 1
    evicted = []
    while True:
        live = [i for i in range(len(seqs)) if i not in evicted]
        left = budget
        decodes, chunks = [], []
        for i in live:
            filled, target = seqs[i]
            if filled < target:
                k = target - filled if left is None else min(target - filled, left)
                if k > 0:
                    chunks.append((i, k))
                    if left is not None:
                        left -= k
            else:
                decodes.append(i)
        growth = len(decodes) + sum(k for i, k in chunks)
        if (sum(seqs[i][0] for i in live) + growth) * device.kv > device.memory:
            evicted.append(live[-1])
            continue
        return StepPlan(admitted, tuple(sorted(evicted)), tuple(decodes), tuple(chunks))


def serving_metrics(records, targets=(3.0, 0.1)):
    ttft = np.array([r.token_times[0] - r.arrival for r in records])
    gaps = [np.diff(r.token_times) for r in records]
    itl = np.concatenate(gaps)
    tpot = [(r.token_times[-1] - r.token_times[0]) / (r.output - 1) for r in records if r.output > 1]
    final = max(r.token_times[-1] for r in records)
    good = sum(1 for t, g in zip(ttft, gaps) if t <= targets[0] and (len(g) == 0 or g.max() <= targets[1]))
    return {"ttft50": float(np.quantile(ttft, 0.5)), "ttft99": float(np.quantile(ttft, 0.99)),
            "itl50": float(np.quantile(itl, 0.5)), "itl99": float(np.quantile(itl, 0.99)),
            "tpot50": float(np.median(tpot)), "goodput": good / final}


def find_capacity(run, targets=(3.0, 0.1), lo=0.01, hi=4.0, steps=10):
    for _ in range(steps):
        mid = (lo + hi) / 2
        result = run(mid)
        if result["ttft99"] <= targets[0] and result["itl99"] <= targets[1]:
            lo = mid
        else:
            hi = mid
    return lo
