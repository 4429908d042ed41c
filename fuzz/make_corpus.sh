#!/usr/bin/env bash
# Writes the seed corpora of the fuzz targets, fuzz/corpus/<target>/, anew:
# small valid inputs of each form a reader accepts, made by strata itself (zoo
# models at tiny sizes, compiled plans of every kind, training checkpoints),
# copied from examples/ and the ONNX test fixtures, or written by python3's
# standard library (.npy and .safetensors variants strata does not write).
#
#   fuzz/make_corpus.sh            with build/tools/strata (scripts/build)
#   STRATA=path/to/strata fuzz/make_corpus.sh
#
# Each corpus stays under about 200 KB. The seeds are checked in; run this
# again when a file format changes. Inputs that found a bug are checked in as
# fuzz/corpus/<target>/regression-<what>, and this keeps them.
set -euo pipefail
cd "$(dirname "$0")/.."
strata=${STRATA:-build/tools/strata}
if [[ ! -x "$strata" ]]; then
  echo "make_corpus: no strata CLI at $strata (run scripts/build, or set STRATA)" >&2
  exit 1
fi
corpus=fuzz/corpus
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
targets=(checkpoint cluster model_binary model_json npy onnx plan_binary plan_json safetensors)
# Inputs that once found a bug (regression-*) are kept; everything else is
# written anew.
for t in "${targets[@]}"; do
  mkdir -p "$corpus/$t"
  find "${corpus:?}/$t" -type f ! -name 'regression-*' -delete
done
quiet() { "$strata" "$@" >/dev/null; }

# Models: every zoo family, the hand-written example, two imported ONNX models
# (inline data rather than initializers); each in binary and in JSON.
quiet zoo mlp --batch 4 --input 4 --hidden 3 --classes 2 -o "$work/mlp.strata"
quiet zoo mlp --batch 4 --input 8 --hidden 16,16 --classes 4 -o "$work/mlp_wide.strata"
quiet zoo convnet --batch 2 --in-channels 1 --image-size 4 --channels 2 --fc-hidden 3 \
  --classes 2 -o "$work/convnet.strata"
quiet zoo gpt --layers 1 --hidden 8 --heads 2 --seq 4 --vocab 16 --batch 2 -o "$work/gpt.strata"
quiet convert examples/tiny_mlp.json -o "$work/tiny_mlp.strata"
quiet import tests/fixtures/onnx/mlp.onnx -o "$work/onnx_mlp.strata"
quiet import tests/fixtures/onnx/convnet.onnx -o "$work/onnx_convnet.strata"
for model in "$work"/*.strata; do
  name=$(basename "$model" .strata)
  cp "$model" "$corpus/model_binary/$name.strata"
  quiet convert "$model" -o "$corpus/model_json/$name.json"
done

# Plans: inference, training (two optimizers and losses), pipelines under each
# schedule, data parallelism with ZeRO-1 and gradient buckets, ZeRO-2 and 3
# (prefetched and not), data-parallel pipelines, tensor parallelism; each in
# binary and in JSON.
plan() {
  local name=$1
  shift
  quiet compile "$@" -o "$work/$name.splan"
  cp "$work/$name.splan" "$corpus/plan_binary/$name.splan"
  quiet convert "$work/$name.splan" -o "$corpus/plan_json/$name.splan.json"
}
plan infer "$work/mlp.strata"
plan train_sgd "$work/mlp.strata" --train --optimizer sgd:lr=0.1,momentum=0.9
plan train_adamw_mse "$work/mlp.strata" --train --loss mse \
  --optimizer adamw:lr=1e-3,clip=1,schedule=cosine,warmup=1,total=10
plan pipeline_1f1b "$work/mlp.strata" --train --mesh 1x1x2 --microbatches 2
plan pipeline_gpipe "$work/mlp.strata" --train --mesh 1x1x2 --microbatches 2 --schedule gpipe
plan pipeline_interleaved "$work/mlp.strata" --train --mesh 1x1x2 --microbatches 2 \
  --schedule interleaved --chunks 2
plan dp_zero_buckets "$work/mlp.strata" --train --mesh 2x1x1 --zero 1 \
  --optimizer adamw:lr=1e-3 --bucket-mb 0.00001
plan dp_zero2 "$work/mlp.strata" --train --mesh 2x1x1 --microbatches 2 --zero 2 \
  --optimizer adamw:lr=1e-3
plan dp_zero3 "$work/mlp.strata" --train --mesh 2x1x1 --microbatches 2 --zero 3 \
  --optimizer adamw:lr=1e-3
plan dp_zero3_blocking "$work/mlp.strata" --train --mesh 2x1x1 --microbatches 2 --zero 3 \
  --no-prefetch --optimizer adamw:lr=1e-3
plan dp_pipeline "$work/mlp.strata" --train --mesh 2x1x2 --bucket-mb 0.00001
plan tensor_parallel "$work/mlp_wide.strata" --train --mesh 1x2x1

# Checkpoints of one training step. A checkpoint seed is the manifest, a NUL
# byte, then the data file (fuzz/checkpoint_fuzz.cc); the second form of each
# has @SIZE@ and @SHA256@ in place of the data file's size and checksum, which
# the target fills in, so that mutated data still passes the checksum.
for name in train_sgd train_adamw_mse dp_zero_buckets; do
  "$strata" run "$corpus/plan_binary/$name.splan" --steps 1 --checkpoint "$work/ckpt_$name" \
    >/dev/null
done
# The rest in python3 (standard library only).
python3 - "$work" "$corpus" <<'EOF'
import json
import os
import re
import struct
import sys

work, corpus = sys.argv[1], sys.argv[2]


def write(target, name, data):
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(corpus, target, name), "wb") as f:
        f.write(data)


# Checkpoints, and their data files as safetensors seeds.
for name in ["train_sgd", "train_adamw_mse", "dp_zero_buckets"]:
    folder = os.path.join(work, "ckpt_" + name)
    with open(os.path.join(folder, "manifest.json")) as f:
        manifest = f.read()
    (entry,) = json.loads(manifest)["files"]
    with open(os.path.join(folder, entry["name"]), "rb") as f:
        data = f.read()
    placeholders = re.sub(r'"size": \d+', '"size": @SIZE@', manifest)
    placeholders = re.sub(r'"sha256": "[0-9a-f]+"', '"sha256": "@SHA256@"', placeholders)
    if entry["name"] == "model-step1.safetensors":  # the name the target writes
        write("checkpoint", name + ".bin", manifest.encode() + b"\0" + data)
    write("checkpoint", name + "_placeholders.bin", placeholders.encode() + b"\0" + data)
    write("safetensors", name + ".safetensors", data)


# .safetensors of every dtype strata reads, a scalar, an empty tensor, no
# metadata, an empty file.
def safetensors(tensors, metadata=True):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {"format": "pt"}
    for name, (dtype, shape, blob) in sorted(tensors.items()):
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


write("safetensors", "dtypes.safetensors", safetensors({
    "f32": ("F32", [2, 2], struct.pack("<4f", 1, -2, 0.5, 3e38)),
    "f16": ("F16", [3], struct.pack("<3H", 0x3C00, 0x7C00, 0x8001)),
    "bf16": ("BF16", [2], struct.pack("<2H", 0x3F80, 0xFF80)),
    "i32": ("I32", [1, 2], struct.pack("<2i", -1, 2**31 - 1)),
    "i64": ("I64", [], struct.pack("<q", -2**63)),
    "bool": ("BOOL", [3], bytes([0, 1, 1])),
}))
# A checkpoint in pieces with its layout record (manifest format 3): a
# tensor-parallel piece, another piece in ZeRO shards, a sharded state
# tensor, a scalar; what the target joins.
pieces = safetensors({
    "w@tp0of2": ("F32", [4, 3], struct.pack("<12f", *range(12))),
    "w@tp1of2@shard0of2": ("F32", [6], struct.pack("<6f", *range(12, 18))),
    "w@tp1of2@shard1of2": ("F32", [6], struct.pack("<6f", *range(18, 24))),
    "w.m@shard0of2": ("F32", [12], struct.pack("<12f", *range(12))),
    "w.m@shard1of2": ("F32", [12], struct.pack("<12f", *range(12, 24))),
    "optimizer.step": ("I64", [], struct.pack("<q", 1)),
})
record = {"role": "parameter", "dtype": "f32", "shape": [4, 6],
          "cut": {"dim": 1, "outer": 1, "parts": 2}}
layout_manifest = json.dumps({
    "format": "strata-checkpoint", "format_version": 3, "fingerprint": "f" * 64,
    "step": 1, "ranks": 1,
    "files": [{"name": "model-step1.safetensors", "size": "@SIZE@", "sha256": "@SHA256@"}],
    "model": "a" * 64, "optimizer": "sgd:lr=0.1,momentum=0.9",
    "layout": "mesh 2x2x1 (DPxTPxPP), 1 micro-batch, 1f1b, ZeRO-1, 4 ranks",
    "tensors": {"w": record,
                "w.m": {"role": "state", "dtype": "f32", "shape": [4, 6]},
                "optimizer.step": {"role": "state", "dtype": "i64", "shape": []}},
}, indent=2).replace('"@SIZE@"', "@SIZE@")
write("checkpoint", "layout_pieces_placeholders.bin", layout_manifest.encode() + b"\0" + pieces)

write("safetensors", "empty_tensor.safetensors",
      safetensors({"none": ("F32", [0, 4], b""), "one": ("F32", [1], struct.pack("<f", 1))},
                  metadata=False))
write("safetensors", "no_tensors.safetensors", safetensors({}))


# .npy: versions 1.0 to 3.0, every dtype strata reads, scalars and empty arrays.
def npy(descr, shape, data, version=1):
    dims = f"({shape[0]},)" if len(shape) == 1 else "(" + ", ".join(map(str, shape)) + ")"
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {dims}, }}"
    width = 2 if version == 1 else 4
    total = 8 + width + len(header) + 1
    header += " " * (-total % 64) + "\n"
    length = struct.pack("<H" if version == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode("latin1") + data


write("npy", "f32_2x3.npy", npy("<f4", [2, 3], struct.pack("<6f", 0, 1, -1, 0.5, 1e-30, 3e38)))
write("npy", "f16_v2.npy", npy("<f2", [3], struct.pack("<3H", 0x3C00, 0x7E00, 0x0001), 2))
write("npy", "i32_scalar_v3.npy", npy("<i4", [], struct.pack("<i", -7), 3))
write("npy", "i64_2x2.npy", npy("<i8", [2, 2], struct.pack("<4q", 0, 1, -1, 2**62)))
write("npy", "bool_4.npy", npy("|b1", [4], bytes([0, 1, 0, 1])))
write("npy", "f32_empty.npy", npy("<f4", [0, 3], b""))

# Cluster specs: the default CPU cluster a plan embeds, and the smallest spec.
with open(os.path.join(corpus, "plan_json", "pipeline_1f1b.splan.json")) as f:
    write("cluster", "plan_default_cpu.json", json.load(f)["pipeline"]["cluster_json"])
write("cluster", "minimal.json", json.dumps({
    "name": "one", "nodes": 1, "devices_per_node": 1,
    "device": {"name": "cpu", "kind": "cpu", "peak_flops": {"f32": 1e9},
               "memory_bandwidth": 1e9, "memory_bytes": 1000000, "launch_overhead_s": 0},
    "intra_node": {"latency_s": 0, "bandwidth_Bps": 1e9}}, indent=2) + "\n")
EOF

# .npy written by strata (a model's output) and by NumPy (test fixtures).
quiet run "$work/mlp.strata" --output "$corpus/npy/strata_output.npy"
cp tests/fixtures/onnx/{mlp.input,block17.input,convnet.loss}.npy "$corpus/npy/"

# ONNX: the importer's fixtures but block13 (block17's graph at opset 13).
for f in tests/fixtures/onnx/*.onnx; do
  if [[ "$(basename "$f")" != block13.onnx ]]; then cp "$f" "$corpus/onnx/"; fi
done

cp examples/clusters/*.json "$corpus/cluster/"

for t in "${targets[@]}"; do
  printf '%-14s %3d files %7d bytes\n' "$t" "$(find "$corpus/$t" -type f | wc -l)" \
    "$(cat "$corpus/$t"/* | wc -c)"
done
