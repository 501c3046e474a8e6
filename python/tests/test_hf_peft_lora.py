"""examples/trainers/hf_peft_lora.py.

HfPeftLoraEndToEnd runs one tiny task (a 2-layer Llama written by transformers, a word-level tokenizer.json) through
the script's real command line; it needs transformers, peft and tokenizers, and is skipped with the reason where
they are missing (they are not Debian packages).

HfPeftLoraWithoutHuggingFace always runs: the script's own code (row encoding and masking, Parsyn's adapter names,
the layout check, training, metrics, the update's dtypes) with a PEFT-shaped torch model and a character tokenizer
standing in for transformers."""

import importlib
import importlib.util
import json
import sys
import tempfile
import types
import unittest
from pathlib import Path

import numpy as np
import torch
from torch import nn

from parsyn import safetensors, trainer
from tests import support

SCRIPT = support.EXAMPLES / "hf_peft_lora.py"
try:
    for library in ("transformers", "peft", "tokenizers"):
        importlib.import_module(library)
    MISSING = None
except ImportError as e:
    MISSING = f"transformers, peft and tokenizers are needed ({e}); pip install transformers peft"

ROWS = [{"prompt": f"count {a} {b}", "completion": f" {c}"} for a, b, c in
        [("one", "two", "three"), ("two", "three", "four"), ("three", "four", "five"), ("four", "five", "six")] * 4]
WORDS = ["<pad>", "<s>", "</s>", "<unk>", "count", "one", "two", "three", "four", "five", "six"]
CONFIG = {"lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "lora_target_modules": ["q_proj", "v_proj"],
          "batch_size": 4, "learning_rate": 0.01, "max_seq_len": 32, "validation_fraction": 0.25,
          "lr_scheduler": "constant"}


def lora_names(layers: int, modules: dict[str, tuple[int, int]], r: int) -> dict[str, tuple[int, ...]]:
    """Parsyn's adapter names and shapes: modules maps q_proj -> (in_features, out_features)."""
    shapes = {}
    for i in range(layers):
        for module, (n_in, n_out) in modules.items():
            prefix = f"base_model.model.model.layers.{i}.self_attn.{module}"
            shapes[f"{prefix}.lora_A.weight"] = (r, n_in)
            shapes[f"{prefix}.lora_B.weight"] = (n_out, r)
    return shapes


def write_adapters(path: Path, shapes: dict[str, tuple[int, ...]], dtype: str = "F32", seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    tensors = {n: (rng.normal(0, 0.1, s) if ".lora_A." in n else np.zeros(s)).astype(np.float32)
               for n, s in shapes.items()}
    safetensors.save(path, tensors, dtypes={n: dtype for n in tensors})
    return path


def write_rows(path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


@unittest.skipIf(MISSING, MISSING)
class HfPeftLoraEndToEnd(unittest.TestCase):
    COMMAND = [sys.executable, str(SCRIPT)]

    def setUp(self):
        self.folder = Path(self.enterContext(tempfile.TemporaryDirectory(prefix="parsyn-hf-")))
        self.model_dir = self.folder / "tiny-llama"
        self.write_model(self.model_dir)
        self.data = write_rows(self.folder / "rows.jsonl")
        # hidden 32, 4 heads of 8, 2 key/value heads: q_proj 32 -> 32, v_proj 32 -> 16.
        self.shapes = lora_names(2, {"q_proj": (32, 32), "v_proj": (32, 16)}, r=4)

    def write_model(self, folder: Path) -> None:
        from tokenizers import Tokenizer, models, pre_tokenizers, processors
        from transformers import LlamaConfig, LlamaForCausalLM

        folder.mkdir()
        tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
        tokenizer.save(str(folder / "tokenizer.json"))
        config = LlamaConfig(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(str(folder), safe_serialization=True)

    def task(self, initial: Path, **fields) -> Path:
        base = {"model_kind": "llama", "model_dir": str(self.model_dir), "initial_weights": str(initial),
                "data": str(self.data), "config": CONFIG, "steps": 4}
        base.update(fields)
        return support.write_task(self.folder / "task.json", **base)

    def test_one_tiny_lora_task_trains_the_adapters_under_parsyns_names(self):
        for dtype in ("F32", "BF16"):
            with self.subTest(dtype=dtype):
                initial = write_adapters(self.folder / f"global-{dtype}.safetensors", self.shapes, dtype)
                run = support.run_trainer(self.COMMAND, "run", str(self.task(initial)), timeout_s=300)
                self.assertEqual(run.returncode, 0, run.stderr[-4000:])
                self.assertEqual(run.events[-1]["event"], "done")
                self.assertEqual(run.events_named("progress")[-1]["throughput_unit"], "tokens/s")
                update = self.folder / "out" / "update.safetensors"
                self.assertEqual(safetensors.layout(update), safetensors.layout(initial))
                trained = safetensors.load(update)
                self.assertTrue(any(np.abs(v).max() > 0 for n, v in trained.items() if ".lora_B." in n))
                result = json.loads((self.folder / "out" / "result.json").read_text())
                self.assertEqual((result["num_samples"], result["num_validation"]), (12, 4))
                self.assertIn("exact_match", result["validation_after"])

    def test_zero_steps_returns_the_adapters_bit_for_bit(self):
        initial = write_adapters(self.folder / "global.safetensors", self.shapes, "BF16")
        run = support.run_trainer(self.COMMAND, "run", str(self.task(initial, steps=0)), timeout_s=300)
        self.assertEqual(run.returncode, 0, run.stderr[-4000:])
        self.assertEqual(support.tensor_bytes(self.folder / "out" / "update.safetensors"),
                         support.tensor_bytes(initial))

    def test_adapters_of_another_rank_are_refused_naming_the_tensor(self):
        initial = write_adapters(self.folder / "r8.safetensors",
                                 lora_names(2, {"q_proj": (32, 32), "v_proj": (32, 16)}, r=8))
        run = support.run_trainer(self.COMMAND, "run", str(self.task(initial)), timeout_s=300)
        self.assertEqual(run.returncode, 1)
        error = run.events_named("error")[0]
        self.assertEqual(error["code"], "invalid_argument")
        self.assertIn("lora_A.weight", error["message"])
        self.assertFalse((self.folder / "out" / "update.safetensors").exists())


# ----------------------------------------------------------------------------------------------------------------
# Stand-ins for transformers and PEFT


class CharTokenizer:
    """A tokenizer with the calling convention the script uses: ids 3.. for characters, bos 1 when asked."""

    eos_token_id = None

    def __init__(self, tokenizer_file: str):
        assert Path(tokenizer_file).name == "tokenizer.json"

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        ids = [3 + (ord(c) % 29) for c in text]
        return {"input_ids": ([1] if add_special_tokens else []) + ids}


class LoraLinear(nn.Module):
    """PEFT's LoRA Linear layout: base_layer, lora_A/lora_B ModuleDicts keyed by the adapter name."""

    def __init__(self, n_in: int, n_out: int, r: int):
        super().__init__()
        self.base_layer = nn.Linear(n_in, n_out)
        self.base_layer.requires_grad_(False)
        self.lora_A = nn.ModuleDict({"default": nn.Linear(n_in, r, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(r, n_out, bias=False)})

    def forward(self, x):
        return self.base_layer(x) + self.lora_B["default"](self.lora_A["default"](x)) * 2.0


class TinyPeftShapedLM(nn.Module):
    """Named as a PeftModel over LlamaForCausalLM: base_model.model.model.layers.{i}.self_attn.{q,v}_proj."""

    def __init__(self, vocab: int = 32, hidden: int = 16, r: int = 4):
        super().__init__()
        attention = nn.Module()
        attention.q_proj, attention.v_proj = LoraLinear(hidden, hidden, r), LoraLinear(hidden, 8, r)
        layer = nn.Module()
        layer.self_attn = attention
        inner = nn.Module()
        inner.layers = nn.ModuleList([layer])
        inner.embed = nn.Embedding(vocab, hidden)
        causal = nn.Module()
        causal.model, causal.head = inner, nn.Linear(hidden + 8, vocab)
        self.base_model = nn.Module()
        self.base_model.model = causal
        for name, p in self.named_parameters():
            p.requires_grad_(".lora_" in name)

    def forward(self, input_ids, attention_mask):
        causal = self.base_model.model
        x = causal.model.embed(input_ids)
        attention = causal.model.layers[0].self_attn
        logits = causal.head(torch.cat([attention.q_proj(x), attention.v_proj(x)], dim=-1))
        return types.SimpleNamespace(logits=logits)


class HfPeftLoraWithoutHuggingFace(unittest.TestCase):
    def setUp(self):
        spec = importlib.util.spec_from_file_location("hf_peft_lora", SCRIPT)
        self.script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.script)
        self.script.hf_libraries = lambda: (types.SimpleNamespace(PreTrainedTokenizerFast=CharTokenizer), None)
        torch.manual_seed(0)
        self.model = TinyPeftShapedLM()
        self.script.load_model = lambda task, device: self.model
        self.folder = Path(self.enterContext(tempfile.TemporaryDirectory(prefix="parsyn-hf-fake-")))
        (self.folder / "model").mkdir()
        (self.folder / "model" / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": [2, 9]}))
        self.shapes = lora_names(1, {"q_proj": (16, 16), "v_proj": (16, 8)}, r=4)
        write_rows(self.folder / "rows.jsonl")

    def run_script(self, initial: Path, **fields) -> dict:
        base = {"model_kind": "llama", "model_dir": "model", "initial_weights": str(initial), "data": "rows.jsonl",
                "config": CONFIG, "steps": 6}
        base.update(fields)
        task_file = support.write_task(self.folder / "task.json", **base)
        return trainer.run_task(task_file, self.script.train, describe=self.script.DESCRIBE)

    def test_prompt_tokens_carry_no_label_and_eos_ends_each_row(self):
        tokenized = self.script.Tokenized([{"prompt": "ab", "completion": "c"}], CharTokenizer("tokenizer.json"),
                                          eos_id=2, max_seq_len=16, source="data")
        self.assertEqual(tokenized.ids, [[1, 3 + ord("a") % 29, 3 + ord("b") % 29, 3 + ord("c") % 29, 2]])
        batch = tokenized.batch([0], pad_id=0, device=torch.device("cpu"))
        self.assertEqual(batch["labels"].tolist(), [[-100, -100, -100, 3 + ord("c") % 29, 2]])
        text = self.script.Tokenized([{"text": "abcdef"}, {"text": "a"}], CharTokenizer("tokenizer.json"),
                                     eos_id=2, max_seq_len=4, source="data")
        self.assertEqual([len(i) for i in text.ids], [4, 3])  # cut at the end, eos only where it fits
        padded = text.batch([0, 1], pad_id=0, device=torch.device("cpu"))
        self.assertEqual(padded["attention_mask"].tolist(), [[1, 1, 1, 1], [1, 1, 1, 0]])
        self.assertEqual(padded["labels"][1].tolist()[-1], -100)
        with self.assertRaisesRegex(trainer.TaskError, "data row 2"):
            self.script.Tokenized([{"prompt": "a", "completion": "b"}, {"text": "c"}],
                                  CharTokenizer("tokenizer.json"), 2, 8, "data")

    def test_adapters_are_named_as_parsyn_names_them(self):
        self.assertEqual({n: tuple(p.shape) for n, p in self.script.adapters(self.model).items()}, self.shapes)

    def test_training_writes_the_adapters_in_the_initial_dtypes(self):
        for dtype in ("F32", "BF16"):
            with self.subTest(dtype=dtype):
                initial = write_adapters(self.folder / f"global-{dtype}.safetensors", self.shapes, dtype)
                result = self.run_script(initial)
                update = self.folder / "out" / "update.safetensors"
                self.assertEqual(safetensors.layout(update), safetensors.layout(initial))
                self.assertTrue(any(np.abs(v).max() > 0 for n, v in safetensors.load(update).items()
                                    if ".lora_B." in n))
                self.assertEqual((result["num_samples"], result["num_validation"]), (12, 4))
                self.assertLess(result["validation_after"]["loss"], result["validation_before"]["loss"])
                for key in ("loss", "perplexity", "accuracy", "exact_match"):
                    self.assertIn(key, result["validation_after"])
                self.assertGreater(result["metrics"]["tokens_seen"], 0)

    def test_zero_steps_and_a_wrong_rank(self):
        initial = write_adapters(self.folder / "global.safetensors", self.shapes, "BF16")
        self.run_script(initial, steps=0)
        self.assertEqual(support.tensor_bytes(self.folder / "out" / "update.safetensors"),
                         support.tensor_bytes(initial))
        wrong = write_adapters(self.folder / "r8.safetensors", lora_names(1, {"q_proj": (16, 16), "v_proj": (16, 8)},
                                                                            r=8))
        with self.assertRaisesRegex(trainer.TaskError, "lora_A.weight' of initial_weights has shape \\[8, 16\\]"):
            self.run_script(wrong)

    def test_jobs_it_cannot_train_are_refused(self):
        initial = write_adapters(self.folder / "global.safetensors", self.shapes)
        for config, message in (({"use_peft": False}, "LoRA adapters only"),
                                ({"lora_target_modules": ["lm_head"]}, "'lm_head'"),
                                ({"mixed_precision": "fp16"}, "fp16 needs a CUDA device")):
            with self.subTest(config=config), self.assertRaisesRegex(trainer.TaskError, message):
                self.run_script(initial, config={**CONFIG, **config})


if __name__ == "__main__":
    unittest.main()
