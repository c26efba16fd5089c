"""int8 ONNX graphs run in fp32: the same numbers on every x86-64 CPU.

Two of the packaged models (bge-small-en-v1.5 and ms-marco-MiniLM-L-12-v2) are onnxruntime
*dynamic* int8 exports: every ``MatMul`` became ``DynamicQuantizeLinear`` → ``MatMulInteger`` →
``Cast`` → ``Mul``. onnxruntime picks the integer kernel by instruction set, and without
AVX-512 VNNI its u8 x s8 kernel saturates 16-bit pair sums, so the same file gives another answer
on an AVX2-only CPU (the cross-encoder's card example: 8.87 there, 9.20 on a VNNI machine).
Activations are also quantised per tensor, so a row's result depends on the other rows of its
batch.

:func:`fp32_session` rewrites each such chain into one fp32 ``MatMul`` against the dequantised
weight (``(w - zero_point) * scale``, exactly the numbers the int8 file stores) when the model is
loaded, in memory. What remains is fp32 arithmetic, where CPUs differ only in summation order
(relative differences around 1e-6), and every row is independent of its batch.

The graph is read with ``protobuf`` (already a dependency of onnxruntime) through a small subset of
the ONNX schema written here; every field not named below is kept as it is. The fp32 weights are
handed to onnxruntime as in-memory initializers, never serialised again.
"""

from __future__ import annotations

import importlib
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

# ONNX TensorProto.DataType values this module reads.
_DTYPES: Final[dict[int, type[np.generic]]] = {
    1: np.float32,
    2: np.uint8,
    3: np.int8,
    6: np.int32,
    7: np.int64,
}
_FLOAT: Final = 1
INT64: Final = 7
"""ONNX ``TensorProto.DataType`` of int64 (for the graph edits of :mod:`.early_exit`)."""
_EXTERNAL: Final = 1  # TensorProto.DataLocation.EXTERNAL
_PACKAGE: Final = "llama_jev_onnx_subset"
_MODEL_CLASS: Any = None


def _model_class() -> Any:
    """The ``ModelProto`` message class of the schema subset (built once)."""
    global _MODEL_CLASS
    if _MODEL_CLASS is not None:
        return _MODEL_CLASS
    # protobuf is a dependency of onnxruntime, so the local extra always brings it.
    descriptor_pb2 = importlib.import_module("google.protobuf.descriptor_pb2")
    descriptor_pool = importlib.import_module("google.protobuf.descriptor_pool")
    message_factory = importlib.import_module("google.protobuf.message_factory")
    field = descriptor_pb2.FieldDescriptorProto
    optional, repeated = field.LABEL_OPTIONAL, field.LABEL_REPEATED
    schema = descriptor_pb2.FileDescriptorProto(name=f"{_PACKAGE}.proto", package=_PACKAGE, syntax="proto2")

    def message(name: str, fields: list[tuple[str, int, int, int, str | None]]) -> None:
        added = schema.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            entry = added.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name is not None:
                entry.type_name = f".{_PACKAGE}.{type_name}"

    # Field numbers are those of onnx/onnx.proto.
    message(
        "StringStringEntryProto",
        [("key", 1, field.TYPE_STRING, optional, None), ("value", 2, field.TYPE_STRING, optional, None)],
    )
    message(
        "TensorProto",
        [
            ("dims", 1, field.TYPE_INT64, repeated, None),
            ("data_type", 2, field.TYPE_INT32, optional, None),
            ("float_data", 4, field.TYPE_FLOAT, repeated, None),
            ("int32_data", 5, field.TYPE_INT32, repeated, None),
            ("name", 8, field.TYPE_STRING, optional, None),
            ("raw_data", 9, field.TYPE_BYTES, optional, None),
            ("external_data", 13, field.TYPE_MESSAGE, repeated, "StringStringEntryProto"),
            ("data_location", 14, field.TYPE_INT32, optional, None),
        ],
    )
    message(
        "NodeProto",
        [
            ("input", 1, field.TYPE_STRING, repeated, None),
            ("output", 2, field.TYPE_STRING, repeated, None),
            ("op_type", 4, field.TYPE_STRING, optional, None),
        ],
    )
    message("ValueInfoProto", [("name", 1, field.TYPE_STRING, optional, None)])
    message(
        "GraphProto",
        [
            ("node", 1, field.TYPE_MESSAGE, repeated, "NodeProto"),
            ("initializer", 5, field.TYPE_MESSAGE, repeated, "TensorProto"),
            ("output", 12, field.TYPE_MESSAGE, repeated, "ValueInfoProto"),
            ("value_info", 13, field.TYPE_MESSAGE, repeated, "ValueInfoProto"),
        ],
    )
    message("ModelProto", [("graph", 7, field.TYPE_MESSAGE, optional, "GraphProto")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(schema)
    _MODEL_CLASS = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.ModelProto"))
    return _MODEL_CLASS


def _array(tensor: Any) -> NDArray[Any]:
    dtype = _DTYPES.get(int(tensor.data_type))
    if dtype is None:
        raise ValueError(f"initializer {tensor.name!r} has ONNX data type {tensor.data_type}, not one read here")
    shape = tuple(int(size) for size in tensor.dims)
    if tensor.raw_data:
        return np.frombuffer(tensor.raw_data, dtype=dtype).reshape(shape)
    if dtype is np.float32:
        return np.asarray(tensor.float_data, dtype=np.float32).reshape(shape)
    return np.asarray(tensor.int32_data, dtype=np.int64).astype(dtype).reshape(shape)


def _only(nodes: list[Any], op_type: str, after: str) -> Any:
    if len(nodes) != 1 or nodes[0].op_type != op_type:
        found = [node.op_type for node in nodes]
        raise ValueError(f"not an onnxruntime dynamic int8 graph: {after} feeds {found}, expected one {op_type}")
    return nodes[0]


def prune(graph: Any) -> None:
    """Delete the nodes and initializers that do not feed a graph output."""
    producer = {output: node for node in graph.node for output in node.output}
    needed = {value.name for value in graph.output}
    todo = list(needed)
    while todo:
        node = producer.get(todo.pop())
        if node is None:
            continue
        for name in node.input:
            if name not in needed:
                needed.add(name)
                todo.append(name)
    for index in reversed(range(len(graph.node))):
        if not any(name in needed for name in graph.node[index].output):
            del graph.node[index]
    for index in reversed(range(len(graph.initializer))):
        if graph.initializer[index].name not in needed:
            del graph.initializer[index]


def dequantize(
    data: bytes,
    *,
    edit: Callable[[Any], None] | None = None,
    tune: Callable[[Any, dict[str, NDArray[np.float32]]], None] | None = None,
) -> tuple[bytes, dict[str, NDArray[np.float32]]]:
    """The graph with every dynamic int8 ``MatMul`` chain as an fp32 ``MatMul``, and its fp32 weights.

    ``edit`` changes the parsed graph further (e.g. :func:`llama_jev.local.early_exit.exit_after`)
    before what no longer feeds an output is removed. ``tune`` then changes the fp32 weights that
    remain (it gets the graph and the weights by name; e.g. :meth:`llama_jev.local.tuned.LayerDelta.merge`).

    The returned graph names each weight as an external initializer; pass the arrays to
    onnxruntime with ``SessionOptions.add_external_initializers`` (see :func:`fp32_session`).
    A graph without ``MatMulInteger`` comes back unchanged with no weights.

    Raises:
        ValueError: a ``MatMulInteger`` is not part of onnxruntime's dynamic quantisation pattern.
    """
    model = _model_class()()
    model.ParseFromString(data)
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    producer = {output: node for node in graph.node for output in node.output}
    consumers: dict[str, list[Any]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    weights: dict[str, NDArray[np.float32]] = {}
    replaced: set[int] = set()
    for node in graph.node:
        if node.op_type != "MatMulInteger":
            continue
        quantized_input, quantized_weight, _, weight_zero_point = node.input
        quantize = producer.get(quantized_input)
        if quantize is None or quantize.op_type != "DynamicQuantizeLinear":
            raise ValueError(f"not an onnxruntime dynamic int8 graph: {quantized_input!r} is not quantised at run time")
        cast = _only(consumers[node.output[0]], "Cast", "MatMulInteger")
        rescale = _only(consumers[cast.output[0]], "Mul", "its Cast")
        scales = producer[next(name for name in rescale.input if name != cast.output[0])]
        weight_scale = next(name for name in scales.input if name in initializers)
        weight = _array(initializers[quantized_weight]).astype(np.float32)
        weight -= _array(initializers[weight_zero_point]).astype(np.float32)
        weight *= _array(initializers[weight_scale]).astype(np.float32)
        name = f"{quantized_weight}/fp32"
        weights[name] = np.ascontiguousarray(weight)
        # The MatMulInteger node becomes the fp32 MatMul that writes the chain's result.
        result = rescale.output[0]
        node.op_type = "MatMul"
        del node.input[:]
        node.input.extend([quantize.input[0], name])
        del node.output[:]
        node.output.append(result)
        replaced.update({id(cast), id(rescale)})
    if not weights and edit is None:
        return data, weights
    # Remove the Cast / Mul pairs, then whatever no longer feeds an output (the quantisers, and
    # what an edit cut off).
    for index in reversed(range(len(graph.node))):
        if id(graph.node[index]) in replaced:
            del graph.node[index]
    if edit is not None:
        edit(graph)
    prune(graph)
    used = {name for node in graph.node for name in node.input}
    weights = {name: weight for name, weight in weights.items() if name in used}
    if tune is not None:
        tune(graph, weights)
    for name, weight in weights.items():
        tensor = graph.initializer.add(name=name, data_type=_FLOAT, dims=list(weight.shape))
        tensor.data_location = _EXTERNAL
        tensor.external_data.add(key="location", value="in-memory")
    serialized: bytes = model.SerializeToString()
    return serialized, weights


class Fp32Session:
    """An onnxruntime session of a dequantised graph, holding the weight buffers it reads."""

    def __init__(self, session: Any, buffers: list[Any]) -> None:
        self.session = session
        # onnxruntime reads the in-memory initializers without copying them: they must outlive it.
        self._buffers = buffers

    def run(self, output_names: Any, feeds: dict[str, Any]) -> Any:
        return self.session.run(output_names, feeds)

    def get_inputs(self) -> Any:
        return self.session.get_inputs()

    def get_outputs(self) -> Any:
        return self.session.get_outputs()


def fp32_session(
    model_path: Path,
    options: Any,
    *,
    edit: Callable[[Any], None] | None = None,
    tune: Callable[[Any, dict[str, NDArray[np.float32]]], None] | None = None,
) -> Any:
    """An onnxruntime session that runs ``model_path`` in fp32 (see the module docstring).

    ``edit`` changes the graph and ``tune`` its weights before the session is built (see :func:`dequantize`).
    """
    onnxruntime = importlib.import_module("onnxruntime")
    data, weights = dequantize(model_path.read_bytes(), edit=edit, tune=tune)
    if not weights and edit is None:
        return onnxruntime.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    names = list(weights)
    values = [onnxruntime.OrtValue.ortvalue_from_numpy(weights[name]) for name in names]
    if names:
        options.add_external_initializers(names, values)
    session = onnxruntime.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    return Fp32Session(session, [weights, values])
