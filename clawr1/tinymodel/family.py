"""A tiny model of a real family, with that family's real tokenizer and chat template: a stand-in checkpoint
for testing "bring your own model" end to end on a laptop.

    python -m clawr1.tinymodel.family qwen3 OUT_DIR      # or llama3_1

The weights are random (a few layers, a narrow width, the family's full vocabulary), then taught for a few
hundred steps to answer every prompt with one fixed reply in the family's own format: for Qwen3 a thinking
block and a Hermes tool call, for Llama 3.1 a JSON tool call. That is what makes the gateway's reasoning and
tool-call paths testable with a model this small; it is a smoke-test model, not a useful one.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import torch

from clawr1.chat import ChatRenderer
from clawr1.tinymodel.build import build_once
from clawr1.tokenizer_packages import FILES, tokenizer_dir

TEACH_TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]
# the reply each family is taught (its turn-closing token is added from the template)
TAUGHT_REPLY = {
    "qwen3": '<think>\nThe user wants a sum.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}'
             '\n</tool_call>',
    "llama3_1": '{"name": "add", "parameters": {"a": 1, "b": 2}}',
}
QUESTIONS = ["What is 1 plus 2?", "Add one and two.", "Hi!", "Sum 1 and 2 please.", "Can you help me?",
             "What's the total of 1 and 2?", "Tell me a joke.", "Compute 1+2."]


def hf_config(family: str, layers: int, hidden: int):
    """A small config of the family: its vocabulary and special-token ids, a narrow body."""
    from transformers import LlamaConfig, Qwen3Config

    common = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=hidden // 4, rms_norm_eps=1e-6, dtype="float32")
    if family == "qwen3":
        return Qwen3Config(vocab_size=151936, max_position_embeddings=4096, rope_theta=1_000_000.0,
                           tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645, **common)
    if family == "llama3_1":
        return LlamaConfig(vocab_size=128256, max_position_embeddings=131072, tie_word_embeddings=False,
                           bos_token_id=128000, eos_token_id=[128001, 128008, 128009],
                           rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 8192}, **common)
    raise ValueError(f"unknown family {family!r}; known: qwen3, llama3_1")


def teaching_examples(renderer: ChatRenderer, family: str) -> list[tuple[list[int], int]]:
    """(ids, where the reply starts) for prompts with and without tools, system messages and tool results."""
    reply = renderer.encode_text(TAUGHT_REPLY[family]) + [renderer.turn_end_id]
    examples = []
    for i, question in enumerate(QUESTIONS):
        for tools in (None, TEACH_TOOLS):
            messages = ([{"role": "system", "content": "You are a helpful assistant."}] if i % 2 else []) + [
                {"role": "user", "content": question}]
            for prompt_messages in (messages, messages + [
                    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "type": "function", "function": {
                        "name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
                    {"role": "tool", "tool_call_id": "call_0", "content": "3"}]):
                prompt = renderer.encode_messages(prompt_messages, tools=tools)
                examples.append((prompt + reply, len(prompt)))
    return examples


def teach(model: torch.nn.Module, examples: list[tuple[list[int], int]], steps: int, seed: int) -> float:
    """Plain next-token training on the replies; returns the last loss."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        ids, start = examples[int(torch.randint(len(examples), (1,), generator=g))]
        x = torch.tensor([ids])
        hidden = model.model(input_ids=x).last_hidden_state[0, start - 1:-1]  # only the reply's positions
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden), x[0, start:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    return float(loss.detach())


def build_family_model(family: str, out: Path, layers: int = 2, hidden: int = 64, steps: int = 200,
                       seed: int = 0) -> Path:
    """Write a tiny `family` model to `out` (config, safetensors, the family's tokenizer files)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = tokenizer_dir(family)
    out.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        shutil.copyfile(source / name, out / name)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(family, layers, hidden))
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(source))
    loss = teach(model, teaching_examples(renderer, family), steps, seed)
    model.save_pretrained(out)
    (out / "clawr1_family_build.json").write_text(json.dumps({"family": family, "layers": layers, "hidden": hidden,
                                                              "steps": steps, "seed": seed, "final_loss": loss}))
    return out


def family_spec_hash(family: str, layers: int = 2, hidden: int = 64, steps: int = 200, seed: int = 0) -> str:
    """What a build depends on: its settings, the family's tokenizer files and the examples it is taught."""
    from transformers import AutoTokenizer

    source = tokenizer_dir(family)
    h = hashlib.sha256(json.dumps([family, layers, hidden, steps, seed, torch.__version__]).encode())
    for name in FILES:
        h.update((source / name).read_bytes())
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(source))
    h.update(json.dumps(teaching_examples(renderer, family)).encode())
    return h.hexdigest()[:12]


def ensure_family_model(family: str, cache: Path, **settings: int) -> Path:
    """The cached tiny `family` model, built first if needed (safe across processes, as the tiny model's cache)."""
    final = cache / f"tiny-{family}-{family_spec_hash(family, **settings)}"
    return build_once(final, "clawr1_family_build.json", lambda partial: build_family_model(family, partial, **settings))


def main() -> None:
    family, out = sys.argv[1], Path(sys.argv[2])
    print(build_family_model(family, out))


if __name__ == "__main__":
    main()
