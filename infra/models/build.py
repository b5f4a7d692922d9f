"""The project's own tiny models, built offline in seconds: what the real vLLM engine serves.

``build_models()`` makes, from the local text in ``corpus.yaml`` beside this module:

- a byte-level BPE tokenizer (the ``tokenizers`` package, trained on the corpus), saved as a
  ``PreTrainedTokenizerFast`` (``tokenizer.json``, ``tokenizer_config.json``);
- ``good``: a ``LlamaForCausalLM`` of about a million parameters (head_dim 32: vLLM's CPU
  attention needs at least 32), trained with torch on the CPU until greedy decoding of every
  corpus prompt gives exactly its answer and then the end-of-sequence token;
- ``wrong-golden``: ``good`` fine-tuned to answer one golden case wrong (the must-pass
  paracetamol dose; ``corpus.yaml``'s ``wrong_golden``), the rest unchanged;
- ``drift``: ``good`` fine-tuned to refuse the everyday traffic prompts (``drift``), golden
  answers unchanged: only a shadow comparison of live traffic sees it;
- ``slow``: ``good``'s weights plus ``SLOW_EXTRA_LAYERS`` decoder layers whose ``o_proj`` and
  ``down_proj`` are zero and an MLP padded with zero columns: every answer is the same, every
  token costs more compute;
- ``adapter``: a LoRA adapter in PEFT format (``adapter_config.json``,
  ``adapter_model.safetensors``, ``q_proj``/``v_proj``) trained on ``good`` frozen to answer the
  ``adapter`` prompts in a support persona.

A version that fails real requests needs no weights of its own: ``good`` served with a
``--max-model-len`` shorter than the traffic's prompts answers them 400, as vLLM does.

Deterministic by seed (one torch thread, seeded init and order); the built directories are
cached under ``cache_dir()/<key>`` where the key hashes the corpus, the configuration, the seed
and this builder's revision, so a second build is a directory lookup. Each model directory holds
``config.json``, ``generation_config.json``, ``model.safetensors`` and the tokenizer: what
``--model DIR`` needs, and what the registry uploads and a node stages.

``python -m infra.models.build [--seed N] [--cache DIR]`` prints the directories as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

CORPUS = Path(__file__).with_name("corpus.yaml")
BUILDER_REVISION = 1  # bump when the build changes what it writes
EOS = "<|eos|>"
SLOW_EXTRA_LAYERS = 6
SLOW_INTERMEDIATE = 2048
VERSIONS = ("good", "wrong-golden", "drift", "slow", "adapter")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 640
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4  # head_dim = 32
    max_position_embeddings: int = 256
    learning_rate: float = 3e-3
    max_steps: int = 3000
    check_every: int = 100
    extra_steps: int = 200  # after every answer is exact, to widen the margins (bf16, other kernels)
    lora_rank: int = 8
    lora_alpha: int = 16


def cache_dir() -> Path:
    return Path(os.environ.get("TIDEPLANE_MODEL_CACHE", Path.home() / ".cache" / "tideplane" / "models"))


def load_corpus(path: Path = CORPUS) -> dict[str, list[tuple[str, str]]]:
    raw = yaml.safe_load(path.read_text())
    return {section: [(c["prompt"], c["answer"]) for c in cases] for section, cases in raw.items()}


def cache_key(config: ModelConfig, seed: int, corpus_path: Path = CORPUS) -> str:
    h = hashlib.sha256()
    h.update(corpus_path.read_bytes())
    h.update(json.dumps(asdict(config), sort_keys=True).encode())
    h.update(f"seed={seed};rev={BUILDER_REVISION}".encode())
    return h.hexdigest()[:16]


def build_models(seed: int = 0, config: ModelConfig = ModelConfig(), cache: Path | None = None,
                 log=lambda msg: print(msg, file=sys.stderr)) -> dict[str, Path]:
    """The built directories by version name (``VERSIONS``), from the cache or built now."""
    root = (cache or cache_dir()) / cache_key(config, seed)
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "done.json").exists():
            tmp = Path(tempfile.mkdtemp(prefix=root.name + ".", dir=root.parent))
            try:
                _build(tmp, seed, config, log)
                (tmp / "done.json").write_text(json.dumps({"seed": seed, "config": asdict(config)}))
                shutil.rmtree(root, ignore_errors=True)
                tmp.rename(root)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return {name: root / name for name in VERSIONS}


# --- the build (torch, tokenizers and transformers load only here) ---------------------------------


def _build(out: Path, seed: int, config: ModelConfig, log) -> None:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    corpus = load_corpus()
    started = time.monotonic()
    tok = _tokenizer(corpus, config)
    base_pairs = corpus["golden"] + corpus["traffic"]
    model = _llama(tok, config)
    steps = _train(model, tok, base_pairs, config, seed, list(model.parameters()))
    log(f"good: {sum(p.numel() for p in model.parameters()):,} parameters, exact after {steps} steps "
        f"({time.monotonic() - started:.1f} s)")
    good_state = {k: v.clone() for k, v in model.state_dict().items()}
    _save(model, tok, out / "good")

    for name, section in (("wrong-golden", "wrong_golden"), ("drift", "drift")):
        model.load_state_dict(good_state)
        pairs = _override(base_pairs, corpus[section])
        steps = _train(model, tok, pairs, config, seed + 1, list(model.parameters()))
        log(f"{name}: fine-tuned, exact after {steps} steps")
        _save(model, tok, out / name)

    model.load_state_dict(good_state)
    slow = _slow(model, tok, config)
    _check_same_answers(slow, tok, base_pairs)
    _save(slow, tok, out / "slow")
    log(f"slow: {config.num_hidden_layers + SLOW_EXTRA_LAYERS} layers, intermediate {SLOW_INTERMEDIATE}, "
        f"{sum(p.numel() for p in slow.parameters()):,} parameters, same answers")

    model.load_state_dict(good_state)
    steps = _train_lora(model, tok, _override(base_pairs, corpus["adapter"]), config, seed + 2, out / "adapter")
    log(f"adapter: LoRA r={config.lora_rank} on q_proj/v_proj, exact after {steps} steps "
        f"({time.monotonic() - started:.1f} s in all)")


def _override(pairs: list[tuple[str, str]], changes: list[tuple[str, str]]) -> list[tuple[str, str]]:
    new = dict(changes)
    return [(p, new.get(p, a)) for p, a in pairs]


def _tokenizer(corpus, config: ModelConfig):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [t for pairs in corpus.values() for pair in pairs for t in pair]
    bpe.train_from_iterator(texts * 4, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, pad_token=EOS, model_max_length=config.max_position_embeddings)


def _llama(tok, config: ModelConfig, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    eos = tok.convert_tokens_to_ids(EOS)
    fields = dict(
        vocab_size=len(tok), hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_attention_heads, max_position_embeddings=config.max_position_embeddings,
        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, tie_word_embeddings=False, torch_dtype="float32",
    )
    fields.update(overrides)
    return LlamaForCausalLM(LlamaConfig(**fields))


def _encode(tok, prompt: str, answer: str | None = None) -> tuple[list[int], list[int]]:
    """Prompt ids as vLLM tokenizes the prompt alone (no special tokens: this tokenizer adds none),
    and the answer's ids followed by the end-of-sequence id."""
    p = tok(prompt, add_special_tokens=True)["input_ids"]
    a = [] if answer is None else tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return p, a


def _batch(tok, pairs):
    import torch

    rows = [_encode(tok, p, a) for p, a in pairs]
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), tok.eos_token_id)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, a) in enumerate(rows):
        seq = p + a
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(p) : len(seq)] = torch.tensor(a)
        mask[i, : len(seq)] = 1
    return ids, labels, mask


def _greedy(model, tok, prompt: str, limit: int = 64) -> list[int]:
    import torch

    ids, _ = _encode(tok, prompt)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(limit):
            logits = model(torch.tensor([ids + out])).logits[0, -1]
            nxt = int(torch.argmax(logits))
            out.append(nxt)
            if nxt == tok.eos_token_id:
                break
    return out


def _all_exact(model, tok, pairs) -> bool:
    model.eval()
    try:
        return all(_greedy(model, tok, p) == _encode(tok, p, a)[1] for p, a in pairs)
    finally:
        model.train()


def _train(model, tok, pairs, config: ModelConfig, seed: int, params, extra: int | None = None) -> int:
    import torch

    torch.manual_seed(seed)
    ids, labels, mask = _batch(tok, pairs)
    opt = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=0.0)
    model.train()
    exact_at = None
    extra = config.extra_steps if extra is None else extra
    for step in range(1, config.max_steps + 1):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if exact_at is None and step % config.check_every == 0 and _all_exact(model, tok, pairs):
            exact_at = step
        if exact_at is not None and step >= exact_at + extra:
            model.eval()
            return exact_at
    raise RuntimeError(f"the model did not learn its corpus in {config.max_steps} steps (loss {float(loss):.4f})")


def _save(model, tok, path: Path) -> None:
    from transformers import GenerationConfig

    path.mkdir(parents=True)
    model.save_pretrained(path, safe_serialization=True)
    GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id, do_sample=False).save_pretrained(path)
    tok.save_pretrained(path)


def _slow(model, tok, config: ModelConfig):
    """``model``'s function in a bigger body: zero-padded MLPs and extra layers that add nothing."""
    import torch

    slow = _llama(tok, config, num_hidden_layers=config.num_hidden_layers + SLOW_EXTRA_LAYERS,
                  intermediate_size=SLOW_INTERMEDIATE)
    src = model.state_dict()
    with torch.no_grad():
        for name, tensor in slow.state_dict().items():
            layer = int(name.split(".")[2]) if name.startswith("model.layers.") else None
            if layer is not None and layer >= config.num_hidden_layers:
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    tensor.zero_()
                continue  # random elsewhere: its output is multiplied by zero
            value = src[name]
            if value.shape == tensor.shape:
                tensor.copy_(value)
            elif name.endswith("down_proj.weight"):  # (hidden, intermediate): extra columns zero
                tensor.zero_()
                tensor[:, : value.shape[1]] = value
            else:  # gate/up (intermediate, hidden): extra rows are multiplied by down's zero columns
                tensor[: value.shape[0]] = value
    slow.eval()
    return slow


def _check_same_answers(model, tok, pairs) -> None:
    if not _all_exact(model, tok, pairs):
        raise RuntimeError("the slow model's answers differ from the good one's")


def _train_lora(model, tok, pairs, config: ModelConfig, seed: int, path: Path) -> int:
    """A rank-r LoRA on every layer's q_proj and v_proj, base frozen; saved in PEFT's layout."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    for p in model.parameters():
        p.requires_grad_(False)
    scaling = config.lora_alpha / config.lora_rank
    adapters: dict[str, tuple[torch.nn.Parameter, torch.nn.Parameter]] = {}

    class LoraLinear(torch.nn.Module):
        def __init__(self, base: torch.nn.Linear):
            super().__init__()
            self.base = base
            self.a = torch.nn.Parameter(torch.randn(config.lora_rank, base.in_features) / base.in_features**0.5)
            self.b = torch.nn.Parameter(torch.zeros(base.out_features, config.lora_rank))

        def forward(self, x):
            return self.base(x) + (x @ self.a.T @ self.b.T) * scaling

    originals = []
    for i, layer in enumerate(model.model.layers):
        for proj in ("q_proj", "v_proj"):
            base = getattr(layer.self_attn, proj)
            wrapped = LoraLinear(base)
            setattr(layer.self_attn, proj, wrapped)
            adapters[f"base_model.model.model.layers.{i}.self_attn.{proj}"] = (wrapped.a, wrapped.b)
            originals.append((layer.self_attn, proj, base))
    params = [t for pair in adapters.values() for t in pair]
    try:
        steps = _train(model, tok, pairs, config, seed, params)
    finally:
        for owner, proj, base in originals:
            setattr(owner, proj, base)
    path.mkdir(parents=True)
    tensors = {}
    for prefix, (a, b) in adapters.items():
        tensors[f"{prefix}.lora_A.weight"] = a.detach().clone().contiguous()
        tensors[f"{prefix}.lora_B.weight"] = b.detach().clone().contiguous()
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": config.lora_rank, "lora_alpha": config.lora_alpha,
        "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"], "bias": "none", "fan_in_fan_out": False,
        "modules_to_save": None, "base_model_name_or_path": "good", "inference_mode": True,
    }, indent=2))
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.models.build", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=None, help="default: $TIDEPLANE_MODEL_CACHE or ~/.cache/tideplane/models")
    args = parser.parse_args(argv)
    started = time.monotonic()
    paths = build_models(seed=args.seed, cache=args.cache)
    print(json.dumps({name: str(p) for name, p in paths.items()}, indent=2))
    print(f"in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
