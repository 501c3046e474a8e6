#!/usr/bin/env python3
"""LoRA fine-tuning of a Llama-family model with Hugging Face Transformers and PEFT, as a trainer of the trainer
contract (docs/trainer-contract.md): it trains the job's LoRA adapters on the worker's JSONL rows and writes them back
under Parsyn's names, so its updates average with the built-in trainer's.

Model folder: config.json (model_type llama, qwen2 or mistral), model.safetensors (or shards with
model.safetensors.index.json) and tokenizer.json, as `parsyn model upload` registers it.
Adapters (initial_weights and the update): PEFT's names without the adapter name,
  base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_A.weight   (r, in_features)
  base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_B.weight   (out_features, r)
  base_model.model.model.layers.{i}.mlp.{gate,up,down}_proj.lora_{A,B}.weight
for the job's config.lora_target_modules, r = lora_r, alpha = lora_alpha (scale alpha / r), dropout = lora_dropout;
the update keeps initial_weights' dtypes (F32 or BF16).
Rows (docs/training.md, "Language-model data"): {"text"} rows take loss on every token; {"prompt", "completion"}
rows on the completion (and eos) only: the prompt is encoded with the tokenizer's special tokens (its template adds
bos), the completion without, then eos (config.json's eos_token_id); rows longer than max_seq_len are cut at the end;
right padding with an attention mask. Metrics: loss, perplexity, token accuracy, exact match (prompt/completion rows:
every completion token is the argmax).
Training: AdamW (config learning_rate, weight_decay, warmup/lr_scheduler) over the adapters only, batch_size,
gradient_accumulation_steps, max_grad_norm, `steps` optimizer steps (or epochs passes), FedProx's proximal_mu;
mixed_precision "bf16" loads the base in bfloat16 and runs under bf16 autocast (adapters stay fp32), "fp16" (CUDA
only) under fp16 autocast with loss scaling. On CUDA when torch sees it (task.device), else the CPU.

Run it:
  python3 examples/trainers/hf_peft_lora.py --describe
  python3 examples/trainers/hf_peft_lora.py run TASK_FILE
  parsyn trainer check --trainer "python3 examples/trainers/hf_peft_lora.py" --model ./my-llama --data train.jsonl
Map it on a worker (a job selects it with config.trainer "hf-peft-lora"):
  parsyn worker --trainer hf-peft-lora="python3 examples/trainers/hf_peft_lora.py" --device cuda:0 ...
Needs python3 with PyTorch, transformers, peft and tokenizers (pip install torch transformers peft), and the parsyn
package (`pip install ./python`; run from a Parsyn checkout it finds ../../python by itself).
"""

import contextlib
import functools
import json
import math
import re
import sys
import time
from pathlib import Path

try:
    from parsyn import safetensors, trainer
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
    from parsyn import safetensors, trainer

import torch
import torch.nn.functional as F

DESCRIBE = {"task_kinds": ["train", "evaluate"], "model_kinds": ["llama", "qwen2", "mistral"],
            "name": "hf-peft-lora", "version": "0.1"}
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER = "default"  # PEFT's adapter name; Parsyn's names leave it out
IGNORE = -100
# PEFT parameter name -> Parsyn name: "....q_proj.lora_A.default.weight" -> "....q_proj.lora_A.weight".
_PEFT_NAME = re.compile(rf"^(base_model\.model\..+\.lora_[AB])\.{ADAPTER}\.weight$")


def hf_libraries():
    """(transformers, peft), or a TaskError saying how to install them."""
    try:
        import peft
        import transformers
    except ImportError as e:
        trainer.fail("invalid_argument", f"hf_peft_lora.py needs transformers and peft on this worker ({e}): "
                                         "pip install transformers peft")
    return transformers, peft


def check_config(task: trainer.Task, device: torch.device) -> None:
    config = task.config
    if task.model_dir is None or not (task.model_dir / "config.json").is_file():
        trainer.fail("invalid_argument", "the task needs model_dir with config.json (a Llama-family model folder)")
    if task.data_format != "jsonl":
        trainer.fail("invalid_argument", f"language models train on JSONL rows, got {task.data_format} data")
    if not config.get("use_peft", True):
        trainer.fail("invalid_argument", "hf_peft_lora.py trains LoRA adapters only: the job has config.use_peft "
                                         "false (full fine-tuning); use the built-in trainer for it")
    unknown = [m for m in config["lora_target_modules"] if m not in TARGETS]
    if unknown:
        trainer.fail("invalid_argument", f"config.lora_target_modules has {unknown[0]!r}; this trainer adapts "
                                         f"{', '.join(TARGETS)}")
    if config["mixed_precision"] == "fp16" and device.type != "cuda":
        trainer.fail("invalid_argument", "config.mixed_precision fp16 needs a CUDA device; use bf16 or no on CPU")


def load_model(task: trainer.Task, device: torch.device):
    """The base model (frozen) with LoRA adapters in fp32, on `device`."""
    transformers, peft = hf_libraries()
    precision = task.config["mixed_precision"]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    # transformers 5 renamed from_pretrained's torch_dtype to dtype.
    dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    base = transformers.AutoModelForCausalLM.from_pretrained(str(task.model_dir), **{dtype_key: dtype})
    lora = peft.LoraConfig(r=int(task.config["lora_r"]), lora_alpha=float(task.config["lora_alpha"]),
                           lora_dropout=float(task.config["lora_dropout"]),
                           target_modules=list(task.config["lora_target_modules"]), bias="none",
                           task_type="CAUSAL_LM")
    model = peft.get_peft_model(base, lora, adapter_name=ADAPTER)
    for name, parameter in model.named_parameters():
        if _PEFT_NAME.match(name):
            parameter.data = parameter.data.float()  # adapters train in fp32 whatever the base's dtype
    return model.to(device)


def adapters(model) -> dict[str, torch.nn.Parameter]:
    """The model's LoRA parameters under Parsyn's names (PEFT's without the adapter name), in model order."""
    named = {}
    for name, parameter in model.named_parameters():
        match = _PEFT_NAME.match(name)
        if match:
            named[match.group(1) + ".weight"] = parameter
    return named


def import_adapters(task: trainer.Task, params: dict[str, torch.nn.Parameter]) -> dict[str, torch.dtype]:
    """Copies initial_weights into the adapters after checking its layout; returns each tensor's dtype in the file
    (the update is written in those)."""
    initial = trainer.load_initial_weights_torch(task)
    expected = {name: (safetensors.torch_dtype_name(initial[name].dtype) if name in initial else "F32",
                       tuple(p.shape)) for name, p in params.items()}
    actual = {name: (safetensors.torch_dtype_name(t.dtype), tuple(t.shape)) for name, t in initial.items()}
    trainer.check_layout(expected, actual, what="initial_weights",
                         reference=f"LoRA r={task.config['lora_r']} on {','.join(task.config['lora_target_modules'])}"
                                   " of the model (lora_r or lora_target_modules differ between worker and job?)")
    for name, tensor in initial.items():
        if not tensor.is_floating_point():
            trainer.fail("invalid_argument", f"initial_weights' tensor {name!r} is {actual[name][0]}, not a float")
    with torch.no_grad():
        for name, parameter in params.items():
            parameter.copy_(initial[name].to(parameter.device, torch.float32))
    return {name: tensor.dtype for name, tensor in initial.items()}


class Tokenized:
    """Rows as token ids with their label start (prompt length), per docs/training.md's rules."""

    def __init__(self, rows: list[dict], tokenizer, eos_id: int | None, max_seq_len: int, source: str):
        self.ids: list[list[int]] = []
        self.prompt_lengths: list[int] = []
        self.prompt_completion = bool(rows) and "completion" in rows[0]
        for number, row in enumerate(rows, start=1):
            ids, prompt_length = self._encode(row, tokenizer, eos_id, f"{source} row {number}")
            self.ids.append(ids[:max_seq_len])
            self.prompt_lengths.append(min(prompt_length, max_seq_len))

    def _encode(self, row: dict, tokenizer, eos_id: int | None, where: str) -> tuple[list[int], int]:
        if self.prompt_completion:
            prompt, completion = row.get("prompt"), row.get("completion")
            if not isinstance(prompt, str) or not isinstance(completion, str) or not completion:
                trainer.fail("invalid_argument", f"{where}: expected {{\"prompt\": str, \"completion\": non-empty "
                                                 "str}} like the first row")
            ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
            if eos_id is not None and ids and ids[-1] == eos_id:
                ids = ids[:-1]  # a template that ends the prompt with eos would teach "stop after the prompt"
            prompt_length = len(ids)
            ids = ids + tokenizer(completion, add_special_tokens=False)["input_ids"]
        else:
            text = row.get("text")
            if not isinstance(text, str) or not text:
                trainer.fail("invalid_argument", f"{where}: expected {{\"text\": non-empty str}} like the first row")
            ids, prompt_length = tokenizer(text, add_special_tokens=True)["input_ids"], 0
        if eos_id is not None and (not ids or ids[-1] != eos_id):
            ids = ids + [eos_id]
        return ids, prompt_length

    def __len__(self) -> int:
        return len(self.ids)

    def num_tokens(self, rows) -> int:
        return sum(len(self.ids[r]) for r in rows)

    def batch(self, rows, pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
        """input_ids, attention_mask and labels (B, T), right-padded; labels -100 on prompt and padding."""
        length = max(len(self.ids[r]) for r in rows)
        input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        labels = torch.full((len(rows), length), IGNORE, dtype=torch.long)
        for i, r in enumerate(rows):
            ids = torch.tensor(self.ids[r], dtype=torch.long)
            input_ids[i, :len(ids)] = ids
            mask[i, :len(ids)] = 1
            labels[i, self.prompt_lengths[r]:len(ids)] = ids[self.prompt_lengths[r]:]
        return {"input_ids": input_ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


def token_losses(model, batch: dict[str, torch.Tensor], autocast) -> tuple[torch.Tensor, torch.Tensor,
                                                                            torch.Tensor]:
    """(summed cross-entropy over the batch's labelled tokens, per-position correctness, per-position mask), with
    labels shifted as causal LMs predict the next token."""
    with autocast():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logits = logits[:, :-1].float()
    labels = batch["labels"][:, 1:]
    counted = labels != IGNORE
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE,
                           reduction="sum")
    return loss, (logits.argmax(-1) == labels) & counted, counted


@torch.no_grad()
def evaluate(model, data: Tokenized, batch_size: int, pad_id: int, device, autocast) -> dict | None:
    if len(data) == 0:
        return None
    model.eval()
    loss_sum, tokens, correct, exact, rows_counted = 0.0, 0, 0, 0, 0
    for begin in range(0, len(data), batch_size):
        rows = list(range(begin, min(begin + batch_size, len(data))))
        loss, right, counted = token_losses(model, data.batch(rows, pad_id, device), autocast)
        loss_sum += loss.item()
        tokens += int(counted.sum())
        correct += int(right.sum())
        has_tokens = counted.any(dim=1)
        exact += int((has_tokens & (right == counted).all(dim=1)).sum())
        rows_counted += int(has_tokens.sum())
    if tokens == 0:
        trainer.fail("invalid_argument", "no validation row has a token to predict (max_seq_len cuts every "
                                         "completion?)")
    loss = loss_sum / tokens
    metrics = {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "accuracy": correct / tokens,
               "num_examples": len(data)}
    if data.prompt_completion:
        metrics["exact_match"] = exact / max(rows_counted, 1)
    return metrics


def fit(task: trainer.Task, model, params: dict, data: Tokenized, pad_id: int, device, autocast):
    """Trains the adapters; returns (mean training loss or None, steps, tokens seen)."""
    config = task.config
    optimizer = torch.optim.AdamW(list(params.values()), lr=float(config["learning_rate"]),
                                  weight_decay=float(config["weight_decay"]))
    scaler = torch.cuda.amp.GradScaler() if config["mixed_precision"] == "fp16" else None
    anchors = {n: p.detach().clone() for n, p in params.items()} if task.proximal_mu > 0 else None
    model.train()
    losses, tokens_seen = [], 0
    for step in trainer.optimizer_steps(task, len(data)):
        started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = step.learning_rate
        optimizer.zero_grad()
        loss_sum = 0.0
        for rows in step.micro_batches:
            summed, _, counted = token_losses(model, data.batch(rows, pad_id, device), autocast)
            # As the built-in trainer: each micro-batch's mean over its labelled tokens, averaged over the step.
            loss = summed / max(int(counted.sum()), 1) / len(step.micro_batches)
            (scaler.scale(loss) if scaler else loss).backward()
            loss_sum += loss.item()
        if anchors is not None:  # FedProx: mu/2 * ||w - w_global||^2 over the adapters, in fp32
            proximal = task.proximal_mu / 2 * sum(((p - anchors[n]) ** 2).sum() for n, p in params.items())
            (scaler.scale(proximal) if scaler else proximal).backward()
        if scaler:
            scaler.unscale_(optimizer)
        if float(config["max_grad_norm"]) > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), float(config["max_grad_norm"]))
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        step_seen = data.num_tokens(r for b in step.micro_batches for r in b)
        tokens_seen += step_seen
        losses.append(loss_sum)
        trainer.report_progress(step.index + 1, step.total, loss=losses[-1],
                                throughput=step_seen / max(time.perf_counter() - started, 1e-9),
                                throughput_unit="tokens/s")
    return (sum(losses) / len(losses) if losses else None), len(losses), tokens_seen


def autocast_for(precision: str, device: torch.device):
    """A context manager factory: bf16/fp16 autocast on `device`, or nothing for "no"."""
    if precision not in ("bf16", "fp16"):
        return contextlib.nullcontext
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return functools.partial(torch.autocast, device_type=device.type, dtype=dtype)


def eos_and_pad(task: trainer.Task, tokenizer) -> tuple[int | None, int]:
    config = json.loads((task.model_dir / "config.json").read_text(encoding="utf-8"))
    eos = config.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if eos is None:
        eos = tokenizer.eos_token_id
    pad = config.get("pad_token_id")
    return eos, pad if isinstance(pad, int) else (eos if eos is not None else 0)


def train(task: trainer.Task) -> dict:
    started = time.monotonic()
    device = trainer.torch_device(task)
    check_config(task, device)
    transformers, _ = hf_libraries()
    torch.manual_seed(task.seed)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(task.model_dir / "tokenizer.json"))
    eos_id, pad_id = eos_and_pad(task, tokenizer)
    model = load_model(task, device)
    params = adapters(model)
    file_dtypes = import_adapters(task, params)

    train_rows, validation_rows = trainer.load_data(task)
    max_seq_len = int(task.config["max_seq_len"])
    train_data = Tokenized(train_rows, tokenizer, eos_id, max_seq_len, "training")
    validation_data = Tokenized(validation_rows, tokenizer, eos_id, max_seq_len, "validation")
    autocast = autocast_for(task.config["mixed_precision"], device)
    batch_size = int(task.config["batch_size"])

    before = evaluate(model, validation_data, batch_size, pad_id, device, autocast)
    train_loss, steps, tokens_seen = ((None, 0, 0) if task.kind == "evaluate" else
                                      fit(task, model, params, train_data, pad_id, device, autocast))
    after = evaluate(model, validation_data, batch_size, pad_id, device, autocast) if steps else before
    if task.kind == "train":
        trainer.save_update(task, {n: p.detach().to("cpu", file_dtypes[n]) for n, p in params.items()})
    return {"num_samples": len(train_data), "num_validation": len(validation_data), "train_loss": train_loss,
            "validation_before": before, "validation_after": after,
            "metrics": {"steps": steps, "tokens_seen": tokens_seen, "wall_s": time.monotonic() - started}}


if __name__ == "__main__":
    trainer.main(describe=DESCRIBE, train=train)
