"""How should correctness enter the gradient of the CWSA-regularized loss?

Compares, on a fixed synthetic problem, training with

* plain cross-entropy,
* cross-entropy + w (1 - soft CWSA) with stop-gradient 0/1 correctness
  (``correctness="hard"``),
* the same with the true-class probability as correctness
  (``correctness="probability"``),

for a linear softmax classifier and a one-hidden-layer MLP, several seeds.
Evaluated on a held-out split with hard metrics written here in NumPy
(float64): accuracy, CWSA at 0.5 and 0.9, AURC (mean of the risks at each
coverage, samples sorted by decreasing confidence) and ECE (15 equal bins).

Prints JSON (settings, per-seed and mean results) and a table. The numbers
quoted in ``cwsa_jax/losses.py`` come from this script.

  .venv/bin/python benchmarks/correctness_choice.py [--seeds 5] [--steps 500]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cwsa_jax.losses import cwsa_regularized_loss

NUM_CLASSES = 10
DIM = 32


def make_data(seed: int, n_train: int, n_test: int, label_noise: float):
  rng = np.random.default_rng(seed)
  means = rng.normal(scale=0.55, size=(NUM_CLASSES, DIM))

  def draw(n):
    y = rng.integers(0, NUM_CLASSES, n)
    x = means[y] + rng.normal(size=(n, DIM))
    flip = rng.random(n) < label_noise
    y = np.where(flip, rng.integers(0, NUM_CLASSES, n), y)
    return x.astype(np.float32), y.astype(np.int32)

  return draw(n_train), draw(n_test)


def init_params(key, model: str):
  if model == "linear":
    return {"w": 0.01 * jax.random.normal(key, (DIM, NUM_CLASSES)), "b": jnp.zeros(NUM_CLASSES)}
  k1, k2 = jax.random.split(key)
  hidden = 64
  return {
      "w1": jax.random.normal(k1, (DIM, hidden)) * np.sqrt(2.0 / DIM), "b1": jnp.zeros(hidden),
      "w2": jax.random.normal(k2, (hidden, NUM_CLASSES)) * np.sqrt(1.0 / hidden),
      "b2": jnp.zeros(NUM_CLASSES),
  }


def apply(params, x):
  if "w" in params:
    return x @ params["w"] + params["b"]
  return jax.nn.relu(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


def train(params, x, y, *, steps, batch_size, learning_rate, loss_name, weight, tau, temperature,
          seed):
  opt = optax.adam(learning_rate)
  n = x.shape[0]
  # Mini-batch indices for every step, drawn once (sampling with reshuffling per epoch).
  rng = np.random.default_rng(seed + 1000)
  epochs = -(-steps * batch_size // n)
  order = np.concatenate([rng.permutation(n) for _ in range(epochs)])
  batches = jnp.asarray(order[:steps * batch_size].reshape(steps, batch_size))

  def loss_fn(p, idx):
    logits = apply(p, x[idx])
    y_batch = y[idx]
    if loss_name == "ce":
      return optax.softmax_cross_entropy_with_integer_labels(logits, y_batch).mean()
    return cwsa_regularized_loss(logits, y_batch, weight=weight, tau=tau, temperature=temperature,
                                 correctness=loss_name)

  @jax.jit
  def run(p):
    def step(carry, idx):
      p, s = carry
      loss, g = jax.value_and_grad(loss_fn)(p, idx)
      u, s = opt.update(g, s, p)
      return (optax.apply_updates(p, u), s), loss
    (p, _), losses = jax.lax.scan(step, (p, opt.init(p)), batches)
    return p, losses

  return run(params)


def hard_metrics(probs: np.ndarray, labels: np.ndarray) -> dict:
  probs = probs.astype(np.float64)
  conf = probs.max(1)
  correct = (probs.argmax(1) == labels).astype(np.float64)
  out = {"accuracy": correct.mean()}
  for tau in (0.5, 0.9):
    s = conf >= tau
    phi = (conf - tau) / (1 - tau)
    out[f"cwsa@{tau}"] = float(np.mean(phi[s] * (2 * correct[s] - 1))) if s.any() else 0.0
    out[f"coverage@{tau}"] = float(s.mean())
  order = np.argsort(-conf, kind="stable")
  errors = np.cumsum(1 - correct[order])
  out["aurc"] = float(np.mean(errors / np.arange(1, len(conf) + 1)))
  bins = np.minimum((conf * 15).astype(int), 14)
  ece = 0.0
  for b in range(15):
    m = bins == b
    if m.any():
      ece += m.mean() * abs(correct[m].mean() - conf[m].mean())
  out["ece"] = float(ece)
  return {k: float(v) for k, v in out.items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=600)
  parser.add_argument("--batch-size", type=int, default=128)
  parser.add_argument("--learning-rate", type=float, default=3e-3)
  parser.add_argument("--n-train", type=int, default=8000)
  parser.add_argument("--n-test", type=int, default=8000)
  parser.add_argument("--weight", type=float, default=1.0)
  parser.add_argument("--tau", type=float, default=0.5)
  parser.add_argument("--temperature", type=float, default=0.05)
  args = parser.parse_args()
  settings = dict(num_classes=NUM_CLASSES, dim=DIM, n_train=args.n_train, n_test=args.n_test,
                  label_noise=0.1, optimizer="adam", learning_rate=args.learning_rate,
                  batch_size=args.batch_size, steps=args.steps, weight=args.weight, tau=args.tau,
                  temperature=args.temperature, seeds=args.seeds)
  start = time.perf_counter()
  rows = []
  for model in ("linear", "mlp"):
    baseline = None
    for loss_name in ("ce", "hard", "probability"):
      per_seed = []
      for seed in range(args.seeds):
        (xtr, ytr), (xte, yte) = make_data(seed, args.n_train, args.n_test, 0.1)
        params = init_params(jax.random.key(seed), model)
        params, _ = train(params, jnp.asarray(xtr), jnp.asarray(ytr), steps=args.steps,
                          batch_size=args.batch_size, learning_rate=args.learning_rate,
                          loss_name=loss_name, weight=args.weight, tau=args.tau,
                          temperature=args.temperature, seed=seed)
        probs = np.asarray(jax.nn.softmax(apply(params, jnp.asarray(xte))))
        per_seed.append(hard_metrics(probs, yte))
      keys = list(per_seed[0])
      table = {k: np.array([r[k] for r in per_seed]) for k in keys}
      if baseline is None:
        baseline = table
      # Paired (same data, same initialisation) differences from cross-entropy.
      delta = {k: float(np.mean(table[k] - baseline[k])) for k in keys}
      delta_std = {k: float(np.std(table[k] - baseline[k])) for k in keys}
      rows.append(dict(model=model, loss=loss_name,
                       mean={k: float(v.mean()) for k, v in table.items()},
                       std={k: float(v.std()) for k, v in table.items()},
                       paired_delta_vs_ce=delta, paired_delta_std=delta_std,
                       per_seed=per_seed))
  report = dict(
      benchmark="correctness_choice", device=str(jax.devices()[0]), platform=platform.platform(),
      jax=jax.__version__, numpy=np.__version__, settings=settings,
      wall_seconds=round(time.perf_counter() - start, 1), results=rows)
  print(json.dumps(report, indent=1))
  names = {"ce": "cross-entropy", "hard": "cwsa, hard", "probability": "cwsa, probability"}
  cols = ("accuracy", "cwsa@0.5", "cwsa@0.9", "aurc", "ece")
  print(f"\nmean over {args.seeds} seeds (paired difference from cross-entropy +- its std)")
  print(f"{'model':6s} {'loss':17s} " + " ".join(f"{c:>19s}" for c in cols))
  for r in rows:
    cells = []
    for c in cols:
      m, d, sd = r["mean"][c], r["paired_delta_vs_ce"][c], r["paired_delta_std"][c]
      cells.append(f"{m:.4f}" + (f" ({d:+.4f}+-{sd:.4f})" if r["loss"] != "ce" else " " * 18))
    print(f"{r['model']:6s} {names[r['loss']]:17s} " + " ".join(f"{x:>19s}" for x in cells))


if __name__ == "__main__":
  main()
