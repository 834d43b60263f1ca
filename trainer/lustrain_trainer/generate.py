"""Sample text from a trained model directory (what train.py writes to SM_MODEL_DIR).

python -m lustrain_trainer.generate MODEL_DIR --prompt "def " [--max-new-tokens 200]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from . import tokenizer as tok
from .model import CONFIG_FILE, MODEL_FILE, CausalLM, ModelConfig, build, config_from_dict


class ModelDirError(ValueError):
    pass


def load_model(model_dir: Path) -> CausalLM:
    if not (model_dir / MODEL_FILE).is_file() and _is_export(model_dir):
        return _load_export(model_dir)
    config_path, weights_path = model_dir / CONFIG_FILE, model_dir / MODEL_FILE
    for path in (config_path, weights_path):
        if not path.is_file():
            raise ModelDirError(
                f"{path} not found: MODEL_DIR must hold {MODEL_FILE} and {CONFIG_FILE} from train.py, "
                "or be what `lustrain export` wrote"
            )
    config = json.loads(config_path.read_text())
    # memory-mapped, and the model's parameters are the mapped tensors themselves: a 70B model is not read into
    # memory whole and then copied into a model of its own (twice its 140 GB), its pages are read as they are used
    state = torch.load(weights_path, map_location="cpu", weights_only=True, mmap=True)
    return assembled(config_from_dict(config["model"]), state)


def assembled(config: ModelConfig, state: dict[str, torch.Tensor]) -> CausalLM:
    """The model of `config` whose parameters are `state`'s tensors, not copies of them: built on the meta device
    (no memory of its own), then given the tensors (load_state_dict's assign)."""
    with torch.device("meta"):
        model = build(config)
    model.load_state_dict(state, assign=True)
    model.tie_weights()  # assign gave the head a Parameter of its own, of the same tensor
    return model.eval()


def _is_export(model_dir: Path) -> bool:
    from .export import is_export

    return is_export(model_dir)


def _load_export(model_dir: Path) -> CausalLM:
    """A Hugging Face directory `lustrain export` wrote (safetensors, config.json): the same model."""
    from .export import load_export

    config, state, _ = load_export(model_dir)
    return assembled(config, state)


def load_tokenizer(model_dir: Path) -> tok.ByteTokenizer | tok.HFTokenizer:
    """The tokenizer the model was trained with: its config's record (an export's lustrain.json), its
    tokenizer.json beside it."""
    if not (model_dir / MODEL_FILE).is_file() and _is_export(model_dir):
        from .export import LUSTRAIN_FILE

        record = model_dir / LUSTRAIN_FILE
        info = json.loads(record.read_text()).get("tokenizer") if record.is_file() else None
    else:
        record = model_dir / CONFIG_FILE
        info = json.loads(record.read_text()).get("tokenizer")
    try:
        return tok.load(info, model_dir)
    except tok.TokenizerError as exc:
        raise ModelDirError(f"{record}: {exc}") from exc


def sample(
    model: CausalLM,
    prompt: str,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    seed: int,
    tokenizer: tok.ByteTokenizer | tok.HFTokenizer | None = None,
) -> str:
    tokenizer = tokenizer or tok.ByteTokenizer()
    # With no prompt the model starts as at a document boundary, which is what EOS means in training (a tokenizer
    # without one starts from its first token).
    start = tokenizer.encode(prompt) if prompt else [tokenizer.eos or 0]
    idx = torch.tensor(start, dtype=torch.long).unsqueeze(0)
    generator = torch.Generator().manual_seed(seed)
    out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator)
    return tokenizer.decode(out[0].tolist() if prompt else out[0, 1:].tolist())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lustrain_trainer.generate",
        description="Sample text from a model directory written by train.py.",
    )
    parser.add_argument("model_dir", metavar="MODEL_DIR", type=Path)
    parser.add_argument("--prompt", default="", help="text to continue (default: start from nothing)")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 picks the likeliest byte each time")
    parser.add_argument("--top-k", type=int, default=40, help="sample among the k likeliest bytes (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.max_new_tokens < 1:
        parser.error(f"--max-new-tokens {args.max_new_tokens}: use 1 or more")
    if args.temperature < 0:
        parser.error(f"--temperature {args.temperature}: use 0 or more")
    try:
        model = load_model(args.model_dir)
        tokenizer = load_tokenizer(args.model_dir)
    except (ModelDirError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = sample(
        model, args.prompt, args.max_new_tokens, args.temperature, args.top_k or None, args.seed, tokenizer
    )
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
