#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (fuzz/fuzz_targets/*.rs) into DIR/<target>/.

Seeds come from our fixtures and real files: tiny but loadable GGUF models written with
the independent `gguf` package (byte-level BPE and SentencePiece vocabularies, every block
format our dequantizers accept, every metadata value type), the tokenizer corpus and
prompts under testdata/, the chat turns and request bodies our tests use, and the first
entries of the real ShareGPT file when it is cached.

usage: fuzz_seeds.py DIR [SHAREGPT_JSON]
"""
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write(dir_, name, data):
    os.makedirs(dir_, exist_ok=True)
    with open(os.path.join(dir_, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))


def gguf_bytes(path, build):
    w = gguf.GGUFWriter(path, arch=None)
    build(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(path, "rb") as f:
        return f.read()


def tensor(w, name, shape, qtype, rng):
    """shape is ggml order (row length first); the writer wants numpy order."""
    data = rng.standard_normal(tuple(reversed(shape))).astype(np.float32) * 0.1
    if qtype == Q.F32:
        w.add_tensor(name, data)
    elif qtype == Q.F16:
        w.add_tensor(name, data.astype(np.float16))
    else:
        try:
            q = gguf.quants.quantize(data, qtype)
        except NotImplementedError:
            # gguf-py cannot quantize K-quants: random blocks of the right size (with small
            # f16 scales) are as good a seed, every bit pattern must dequantize.
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            rows = int(np.prod(shape[1:]))
            q = rng.integers(0, 256, (rows, shape[0] // block * size), dtype=np.uint8)
            q[:, -2:] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)


def byte_chars():
    """GPT-2's byte -> printable character map (what byte-level BPE vocabularies hold)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def bpe_vocab(w):
    tokens = byte_chars() + ["he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "ld", "Ġworld",
                             "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * (len(tokens) - 3) + [3, 3, 3]
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "smollm")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"])
    w.add_uint32("tokenizer.ggml.bos_token_id", len(tokens) - 3)
    w.add_uint32("tokenizer.ggml.eos_token_id", len(tokens) - 1)
    w.add_string("tokenizer.chat_template",
                 "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return len(tokens)


def spm_vocab(w):
    tokens = ["<unk>", "<s>", "</s>", "<start_of_turn>", "<end_of_turn>"]
    types = [2, 3, 3, 3, 3]
    tokens += ["<0x%02X>" % b for b in range(256)]
    types += [6] * 256
    pieces = ["▁", "h", "i", "▁h", "▁hi", "hi", "é", "\n", "▁the", "e"]
    tokens += pieces
    types += [1] * len(pieces)
    scores = [0.0] * (len(tokens) - len(pieces)) + [-10.0 + len(p) for p in pieces]
    w.add_string("tokenizer.ggml.model", "llama")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.scores", scores)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_bool("tokenizer.ggml.add_space_prefix", False)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 4)
    return len(tokens)


def tiny_model(arch, vocab, qtypes, rng):
    """A loadable one-layer model: n_embd 32, 4 heads of 8, 2 KV heads, ff 64."""
    def build(w):
        w.add_string("general.architecture", arch)
        w.add_string("general.name", "fuzz-seed")
        w.add_uint32("general.file_type", 2)
        n_vocab = vocab(w)
        for k, v in [("context_length", 128), ("embedding_length", 32), ("block_count", 1),
                     ("feed_forward_length", 64), ("attention.head_count", 4),
                     ("attention.head_count_kv", 2), ("rope.dimension_count", 8)]:
            w.add_uint32(f"{arch}.{k}", v)
        w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
        w.add_float32(f"{arch}.rope.freq_base", 10000.0)
        if arch == "gemma3":
            w.add_uint32(f"{arch}.attention.key_length", 8)
            w.add_uint32(f"{arch}.attention.value_length", 8)
            w.add_uint32(f"{arch}.attention.sliding_window", 64)
        qa, qb = qtypes
        tensor(w, "token_embd.weight", [32, n_vocab], qa, rng)
        tensor(w, "output_norm.weight", [32], Q.F32, rng)
        b = "blk.0."
        tensor(w, b + "attn_norm.weight", [32], Q.F32, rng)
        tensor(w, b + "attn_q.weight", [32, 32], qb, rng)
        tensor(w, b + "attn_k.weight", [32, 16], qb, rng)
        tensor(w, b + "attn_v.weight", [32, 16], qa, rng)
        tensor(w, b + "attn_output.weight", [32, 32], qb, rng)
        if arch == "qwen2":
            for n, d in [("attn_q.bias", 32), ("attn_k.bias", 16), ("attn_v.bias", 16)]:
                tensor(w, b + n, [d], Q.F32, rng)
        if arch == "gemma3":
            for n, d in [("attn_q_norm.weight", 8), ("attn_k_norm.weight", 8),
                         ("post_attention_norm.weight", 32), ("post_ffw_norm.weight", 32)]:
                tensor(w, b + n, [d], Q.F32, rng)
        tensor(w, b + "ffn_norm.weight", [32], Q.F32, rng)
        tensor(w, b + "ffn_gate.weight", [32, 64], qa, rng)
        tensor(w, b + "ffn_up.weight", [32, 64], qb, rng)
        tensor(w, b + "ffn_down.weight", [64, 32], qa, rng)
    return build


def tensor_zoo(rng):
    def build(w):
        w.add_string("general.architecture", "llama")
        for i, q in enumerate([Q.F32, Q.F16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0,
                               Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]):
            tensor(w, f"t{i}.{q.name}", [256, 1], q, rng)
    return build


def metadata_zoo(w):
    w.add_string("general.architecture", "llama")
    w.add_uint8("a.u8", 7)
    w.add_int8("a.i8", -7)
    w.add_uint16("a.u16", 700)
    w.add_int16("a.i16", -700)
    w.add_uint32("a.u32", 70000)
    w.add_int32("a.i32", -70000)
    w.add_float32("a.f32", 0.5)
    w.add_uint64("a.u64", 1 << 40)
    w.add_int64("a.i64", -(1 << 40))
    w.add_float64("a.f64", 0.25)
    w.add_bool("a.bool", True)
    w.add_string("a.str", "héllo")
    w.add_array("a.arr_i32", [1, -2, 3])
    w.add_array("a.arr_f32", [0.5, 1.5])
    w.add_array("a.arr_str", ["x", "yz", ""])
    w.add_array("a.arr_bool", [True, False])
    w.add_uint32("general.alignment", 64)


def main():
    out = sys.argv[1]
    sharegpt = sys.argv[2] if len(sys.argv) > 2 else None
    rng = np.random.default_rng(0)
    tmp = os.path.join(out, ".tmp.gguf")
    os.makedirs(out, exist_ok=True)
    g = os.path.join(out, "gguf")
    write(g, "llama-bpe-q4_0-q8_0", gguf_bytes(tmp, tiny_model("llama", bpe_vocab, (Q.Q4_0, Q.Q8_0), rng)))
    write(g, "qwen2-spm-q4_1-q5_0", gguf_bytes(tmp, tiny_model("qwen2", spm_vocab, (Q.Q4_1, Q.Q5_0), rng)))
    write(g, "gemma3-spm-f16-q5_1", gguf_bytes(tmp, tiny_model("gemma3", spm_vocab, (Q.F16, Q.Q5_1), rng)))
    write(g, "tensor-zoo", gguf_bytes(tmp, tensor_zoo(rng)))
    write(g, "metadata-zoo", gguf_bytes(tmp, metadata_zoo))
    os.remove(tmp)

    corpus = json.load(open(os.path.join(ROOT, "testdata/tokenizer/corpus.json"), encoding="utf-8"))
    prompts = [l.rstrip("\n").replace("\\n", "\n") for l in open(os.path.join(ROOT, "testdata/prompts.txt"), encoding="utf-8")]
    texts = corpus + prompts + [
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "<start_of_turn>user\n😀<end_of_turn>\n<start_of_turn>model\n",
        "<|endoftext|><s></s><unk><|fim_prefix|>",
    ]
    # tokenizer: selector byte (model, add/parse special, skip) + text.
    for i, t in enumerate(texts):
        write(os.path.join(out, "tokenizer"), f"t{i:03}", bytes([(i * 37) & 0x7f]) + t.encode("utf-8"))

    # chat_template: selector + role/content fields separated by 0xff.
    conversations = [
        [("user", "Hi")],
        [("system", "You are terse."), ("user", "Hi there"), ("assistant", "Hello!"), ("user", "2+2?")],
        [("user", "{{ 7*7 }} {% raw %}"), ("assistant", "<|im_end|><end_of_turn>")],
        [("tool", "x"), ("developer", "y")],
    ] + [[("user", t)] for t in texts[::7]]
    for i, conv in enumerate(conversations):
        body = b"\xff".join(f.encode("utf-8") for m in conv for f in m)
        write(os.path.join(out, "chat_template"), f"c{i:03}", bytes([(i * 13) & 0xff | 0x08]) + body)

    # openai_request: selector (model, chat/completion) + JSON body [+ 0xff + constrained text].
    reqs = [
        ({"prompt": "The capital of France is", "max_tokens": 16}, b""),
        ({"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0.7, "top_p": 0.9, "top_k": 40,
          "min_p": 0.05, "seed": 3, "stop": ["\n", "."], "logprobs": 2, "logit_bias": {"5": -100}}, b""),
        ({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
          "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}, "n": 2}, b""),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
          "logprobs": True, "top_logprobs": 3, "max_completion_tokens": 5, "cache_salt": "a"}, b""),
        ({"messages": [{"role": "user", "content": "JSON please"}], "response_format": {"type": "json_object"}},
         b'{"a": [1, 2.5e3, true, null, "x\\u00e9"]}'),
        ({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
            "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                             "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
            "required": ["name"]}}}}, b'{"name": "Ann", "age": 3, "tags": ["a"]}'),
    ]
    for i, (r, tail) in enumerate(reqs):
        sel = (i % 3) | (0x10 if "messages" in r else 0)
        write(os.path.join(out, "openai_request"), f"r{i:03}",
              bytes([sel]) + json.dumps(r).encode() + (b"\xff" + tail if tail else b""))

    # json_schema: mode 0 + schema text [+ 0xff + token choices], or mode 1 + generator bytes.
    schemas = [
        {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                          "age": {"type": "integer"}}, "required": ["name"]},
        {"type": "array", "items": {"enum": ["a", "abc"]}, "minItems": 1, "maxItems": 3},
        {"type": "object", "required": ["k"], "additionalProperties": {"type": "number"}},
        {"type": "object", "additionalProperties": False},
        {"properties": {"x": {"type": "boolean"}}, "required": ["x"]},
        {"type": "string", "minLength": 5, "maxLength": 1},
        {"type": "integer", "enum": ["abc"]},
        {},
    ]
    for i, sc in enumerate(schemas):
        write(os.path.join(out, "json_schema"), f"s{i:03}",
              b"\x00" + json.dumps(sc).encode() + b"\xff" + bytes(range(i, i + 40)))
    for i in range(8):
        write(os.path.join(out, "json_schema"), f"g{i:03}", bytes([1] + [(i * 37 + k * 11) & 0xff for k in range(64)]))

    # sharegpt: small files in the real layout, cut and whole.
    sg = os.path.join(out, "sharegpt")
    entries = [
        {"id": "a", "conversations": [{"from": "human", "value": "Hi there, how are you?"},
                                      {"from": "gpt", "value": "Fine, thanks for asking."}]},
        {"id": "b", "conversations": [{"from": "human", "value": "x"}]},
        {"id": "c", "conversations": []},
    ]
    whole = json.dumps(entries, ensure_ascii=False)
    write(sg, "synthetic", whole)
    write(sg, "synthetic-cut", whole[: len(whole) // 2])
    if sharegpt and os.path.exists(sharegpt):
        with open(sharegpt, "rb") as f:
            head = f.read(200_000)
        # The first few whole entries, as a file of their own, and the raw cut head.
        text = head.decode("utf-8", "ignore")
        dec, pos, real = json.JSONDecoder(), text.index("[") + 1, []
        while True:
            while pos < len(text) and text[pos] in " \t\r\n,":
                pos += 1
            try:
                obj, pos = dec.raw_decode(text, pos)
            except ValueError:
                break
            real.append(obj)
        for i in range(0, min(len(real), 40), 8):
            write(sg, f"real{i:03}", json.dumps(real[i:i + 8], ensure_ascii=False))
        write(sg, "real-cut", head[:3000])


if __name__ == "__main__":
    main()
