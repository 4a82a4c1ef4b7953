# SPDX-License-Identifier: MIT
"""Converts the SmolLM2-135M-Instruct GGUF (scripts/get-model.sh) into a
Hugging Face directory vLLM loads: config.json, model.safetensors and a
corrected tokenizer.

    python hf_model.py GGUF OUTDIR

transformers loads the GGUF (it needs the gguf package) and saves the model
as it is; the tokenizer it saves needs three corrections (issue 26/27), or
vLLM garbles every prompt (output full of 'Ġ'): the class
PreTrainedTokenizerFast (it writes a CodeLlamaTokenizer config), a ByteLevel
decoder (it writes a sentencepiece-style one) and <|im_end|> as EOS (the
chat turn's end; <|endoftext|> otherwise). The chat template comes from the
GGUF (tokenizer.chat_template). Written into OUTDIR.part, renamed whole.
"""
import json
import os
import shutil
import sys


def fix_tokenizer(out, eos_id):
    tj = os.path.join(out, "tokenizer.json")
    with open(tj) as f:
        t = json.load(f)
    t["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True}
    # no BOS added on encoding: the chat template's text starts with
    # <|im_start|> itself (the GGUF's add-BOS would double it), as in the
    # Hugging Face release of the model
    t["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True}
    with open(tj, "w") as f:
        json.dump(t, f, ensure_ascii=False)
    tc = os.path.join(out, "tokenizer_config.json")
    with open(tc) as f:
        c = json.load(f)
    c["tokenizer_class"] = "PreTrainedTokenizerFast"
    c["eos_token"] = "<|im_end|>"
    c["eos_token_id"] = eos_id
    c["clean_up_tokenization_spaces"] = False
    c["add_bos_token"] = False  # (transformers >= 5.1x rebuilds the post-processor from these)
    c["add_eos_token"] = False
    # CodeLlama's infill tokens, which this vocabulary does not have (vLLM
    # would add them as new tokens)
    for k in ("legacy", "add_prefix_space", "eot_token", "fill_token", "middle_token",
              "prefix_token", "suffix_token", "extra_special_tokens"):
        c.pop(k, None)
    with open(tc, "w") as f:
        json.dump(c, f, ensure_ascii=False, indent=1)
    stm = os.path.join(out, "special_tokens_map.json")
    if os.path.exists(stm):
        with open(stm) as f:
            s = json.load(f)
        s["eos_token"] = "<|im_end|>"
        with open(stm, "w") as f:
            json.dump(s, f, ensure_ascii=False, indent=1)


def fix_config(out, eos_id):
    for name in ("config.json", "generation_config.json"):
        p = os.path.join(out, name)
        if not os.path.exists(p):
            continue
        with open(p) as f:
            c = json.load(f)
        c["eos_token_id"] = eos_id
        with open(p, "w") as f:
            json.dump(c, f, indent=1)


def save_model(model, out):
    """The dequantized weights and the config. transformers >= 5.1x refuses
    save_pretrained of a model loaded from a GGUF ("quantized with
    QuantizationMethod.GGUF and is not serializable"), although the loaded
    tensors are plain f32: written here with safetensors, the tied
    lm_head left out (tie_word_embeddings), no quantization_config."""
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        sd.pop("lm_head.weight", None)
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    c = model.config.to_dict()
    c.pop("quantization_config", None)
    c["architectures"] = [type(model).__name__]
    with open(os.path.join(out, "config.json"), "w") as fh:
        json.dump(c, fh, indent=1)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(out)


def main(argv):
    if len(argv) != 3:
        print("usage: hf_model.py GGUF OUTDIR", file=sys.stderr)
        return 2
    gguf, out = argv[1], argv[2]
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = os.path.dirname(os.path.abspath(gguf)), os.path.basename(gguf)
    part = out + ".part"
    shutil.rmtree(part, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    save_model(model, part)
    tok.save_pretrained(part)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    fix_tokenizer(part, eos)
    fix_config(part, eos)
    # check: the corrected tokenizer round-trips text and agrees with the GGUF's
    from transformers import PreTrainedTokenizerFast
    t2 = PreTrainedTokenizerFast.from_pretrained(part)
    text = "<|im_start|>user\nThe code for the blue door is 48213. Ünïcode, tabs\tand  spaces."
    a = tok(text, add_special_tokens=False)["input_ids"]
    b = t2(text, add_special_tokens=False)["input_ids"]
    if a != b:
        print(f"hf_model: the saved tokenizer encodes differently: {a} vs {b}", file=sys.stderr)
        return 1
    if t2(text)["input_ids"] != b:  # the text's own <|im_start|>, no BOS added
        print("hf_model: the saved tokenizer adds special tokens", file=sys.stderr)
        return 1
    back = t2.decode(b, skip_special_tokens=False)
    if back != text:
        print(f"hf_model: the saved tokenizer decodes {back!r}", file=sys.stderr)
        return 1
    if t2.eos_token != "<|im_end|>":
        print(f"hf_model: eos is {t2.eos_token!r}", file=sys.stderr)
        return 1
    shutil.rmtree(out, ignore_errors=True)
    os.replace(part, out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
