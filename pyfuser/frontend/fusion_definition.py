"""FusionDefinition: the Python API users write fusions with, shaped like nvFuser's.

    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
        w = fd.define_tensor(shape=[-1], dtype=DataType.BFloat16)
        xf = fd.ops.cast(x, DataType.Float)
        ...
        fd.add_output(y)
    (y,) = fd.execute([x_tensor, w_tensor])

Types are promoted as torch does and shapes are checked while the fusion is defined; an error
names the op, the operand and what is wrong.
"""
from __future__ import annotations

from ..ir import arith
from ..ir.base import current_fusion, frontend_ops, pop_fusion, push_fusion
from ..ir.dtype import DataType, default_scalar_type, from_torch, parse_dtype
from ..ir.exprs import RandOp
from ..ir.fusion import Fusion
from ..ir.scalar import Scalar
from ..ir.tensor import TensorView
from ..ir.verifier import verify
from .ops import FusionDefinitionError, Ops


class FusionDefinition:
    def __init__(self, name: str | None = None):
        self.name = name or "fusion"
        self.fusion = Fusion()
        self.ops = Ops(self)
        frontend_ops[self.fusion] = self.ops     # what operators on its tensors call (a + b)
        self._defining = False
        self._finalized = False
        # Why the last `with fd:` failed ("Type: message"), until the next one starts over.
        self._failed = ""
        self._executor = None
        self._no_rng = False
        # (seed, offset) the last execute() drew for random ops defined without rng_seed
        # (rerun them with those, or evaluate the fusion on `complete_inputs`).
        self.last_rng_state = None
        self._rng_streams = None        # random ops of the fusion (complete_inputs)

    # Context ----------------------------------------------------------------------------------
    def __enter__(self):
        if self._finalized:
            raise FusionDefinitionError("this FusionDefinition is already complete; make a new one")
        if self._defining:
            raise FusionDefinitionError("this FusionDefinition is already being defined (a "
                                        "`with fd:` inside `with fd:`)")
        if self._failed:
            # A definition that raised is discarded whole: its inputs, ops and outputs would
            # otherwise stay in the fusion under the new attempt's (stale inputs counted by
            # execute, dead ops scheduled). Tensors kept from it belong to the old fusion, and
            # ops refuse them.
            self.fusion = Fusion()
            frontend_ops[self.fusion] = self.ops
            self._failed = ""
        self._defining = True
        push_fusion(self.fusion)
        return self

    def __exit__(self, exc_type, exc, tb):
        pop_fusion(self.fusion)
        self._defining = False
        if exc_type is not None:
            self._failed = f"{exc_type.__name__}: {exc}"
            return False
        try:
            if not self.fusion.outputs:
                raise FusionDefinitionError(f"{self.name}: no outputs; call fd.add_output(t)")
            verify(self.fusion)
        except Exception as e:
            self._failed = f"{type(e).__name__}: {e}"
            raise
        self._finalized = True
        # A fusion whose random ops draw their seed per call never takes the guarded call.
        self._no_rng = self.fusion.implicit_rng is None
        return False

    def _require_defining(self, what: str) -> None:
        if not self._defining:
            raise FusionDefinitionError(f"{what}: call it inside `with FusionDefinition() as fd:`")
        if current_fusion() is not self.fusion:
            # New tensors and scalars join the innermost open definition's fusion.
            raise FusionDefinitionError(f"{what}: another FusionDefinition's `with` block is open "
                                        "inside this one's; call it there, or after that block")

    # Definitions ------------------------------------------------------------------------------
    def define_tensor(self, shape, contiguity=None, dtype=DataType.Float, stride_order=None,
                      expanded=None, is_cpu: bool = False) -> TensorView:
        """An input tensor. `shape`: -1 symbolic, 1 broadcast, or a fixed size.

        `stride_order[k]`: stride rank of dim k (rank-1 outermost, 0 innermost; None = row
        major). `contiguity`: one flag per dim in allocation order (outer to inner), True where
        the dim is dense over the ones inside it; None entries for broadcast dims.
        """
        self._require_defining("define_tensor")
        if is_cpu:
            raise FusionDefinitionError("define_tensor: CPU scalar tensors are not supported")
        dtype = parse_dtype(dtype)
        if contiguity is not None and not isinstance(contiguity, (list, tuple)):
            contiguity = [bool(contiguity)] * len(shape)
        try:
            tv = arith.input_tensor(list(shape), dtype, contiguity, stride_order, expanded)
        except ValueError as e:
            raise FusionDefinitionError(str(e)) from None
        self.fusion.add_input(tv)
        return tv

    def from_pytorch(self, tensor, static_sizes: bool = False) -> TensorView:
        """An input defined like `tensor`: dtype, rank, broadcast dims (size 1 or stride 0),
        stride order and contiguity."""
        from ..runtime.inputs import tensor_descriptor

        shape, contiguity, stride_order, expanded = tensor_descriptor(tensor.shape, tensor.stride())
        if static_sizes:
            shape = [s if e or s == 1 else int(t) for s, e, t in zip(shape, expanded, tensor.shape)]
        return self.define_tensor(shape, contiguity, from_torch(tensor.dtype), stride_order,
                                  expanded=expanded if any(expanded) else None)

    def define_scalar(self, value=None, dtype=None) -> Scalar:
        """A constant scalar (value given) or a runtime scalar input (value None)."""
        self._require_defining("define_scalar")
        if dtype is not None and parse_dtype(dtype).is_float8:
            raise FusionDefinitionError(f"define_scalar: {parse_dtype(dtype).short_name} is a "
                                        "tensor storage type; define the scalar in float32")
        if value is None:
            if dtype is None:
                raise FusionDefinitionError("define_scalar: a runtime scalar needs a dtype")
            dt = parse_dtype(dtype)
            s = Scalar(dt, None, symbol=f"s{len(self.fusion.scalar_inputs())}")
            self.fusion.add_input(s)
            return s
        dt = parse_dtype(dtype) if dtype is not None else default_scalar_type(value)
        if dt.is_floating:
            value = float(value)
        elif dt.is_integral:
            value = int(value)
        return Scalar(dt, value)

    def _implicit_rng_state(self) -> tuple:
        """The seed and offset scalars of random ops defined without rng_seed: fusion inputs
        the caller does not pass; execute() draws them from torch's generator (Fusion.
        implicit_rng holds their input positions)."""
        if self.fusion.implicit_rng is None:
            seed = self.define_scalar(dtype=DataType.Int)
            offset = self.define_scalar(dtype=DataType.Int)
            self.fusion.implicit_rng = (self.fusion.inputs.index(seed),
                                        self.fusion.inputs.index(offset))
        k_seed, k_offset = self.fusion.implicit_rng
        return self.fusion.inputs[k_seed], self.fusion.inputs[k_offset]

    def complete_inputs(self, inputs, rng_state=None, device=None, record: bool = True) -> list:
        """The fusion's inputs: `inputs` as the caller passes them, with the seed and offset of
        implicit random ops inserted (`rng_state`, or drawn from torch's generator: the CUDA
        generator of the inputs' device, advanced past the fusion's random streams as torch
        advances it, or the CPU generator)."""
        rng = self.fusion.implicit_rng
        if rng is None:
            return inputs
        if not isinstance(inputs, (list, tuple)):
            return inputs               # execute's own check names the mistake
        want = len(self.fusion.inputs) - len(rng)
        if len(inputs) != want:
            from ..runtime.inputs import InputError
            raise InputError(f"the fusion takes {want} inputs, got {len(inputs)} (its random "
                             "ops' seed and offset are drawn by execute, not passed)")
        if rng_state is None:
            if self._rng_streams is None:       # counted once, not on every call
                self._rng_streams = sum(1 for e in self.fusion.exprs() if isinstance(e, RandOp))
            rng_state = _draw_rng_state(self._rng_streams, inputs, device)
        if record:
            self.last_rng_state = tuple(rng_state)
        user = iter(inputs)
        return [rng_state[rng.index(k)] if k in rng else next(user)
                for k in range(len(self.fusion.inputs))]

    def add_output(self, t, alias_input=None) -> None:
        """Make `t` an output. With `alias_input` (an input tensor of this fusion), `t` is an
        in-place update, as nvFuser's add_output(output, alias_input): each execute writes it
        into that input's storage (running statistics, optimizer states), and execute does not
        return it, unless `t` is also added as a plain output (before or after). It must have
        the input's dtype and shape, and one input receives one output."""
        self._require_defining("add_output")
        if not isinstance(t, TensorView):
            raise FusionDefinitionError(f"add_output: outputs must be tensors, got {type(t).__name__}")
        if t.fusion is not self.fusion:
            raise FusionDefinitionError(f"add_output: T{t.name} belongs to another fusion")
        try:
            if alias_input is None:
                self.fusion.add_output(t)
                return
            if isinstance(alias_input, TensorView) and alias_input.fusion is not self.fusion:
                raise ValueError(f"alias_input T{alias_input.name} belongs to another fusion")
            if t in self.fusion.inputs:
                # An input written into another input's storage: the kernel writes a copy.
                t = arith.set_op(t)
            self.fusion.alias_output_to_input(t, alias_input)
        except (ValueError, TypeError) as e:
            raise FusionDefinitionError(f"add_output: {e}") from None

    # Execution --------------------------------------------------------------------------------
    def execute(self, inputs, *, options=None, device=None):
        """Run the fusion on `inputs` and return its outputs (a list of tensors). `device`: where
        a fusion without tensor inputs runs (a CUDA device index, "cuda:1" or a torch.device;
        default the current CUDA device); with tensor inputs it must be theirs."""
        executor = self._executor
        if executor is None:        # the first call (the executor is made once finalized)
            executor = self._first_executor()
        call = executor.guarded_call
        if call is not None and options is None and device is None and self._no_rng:
            outputs = call(inputs)      # a signature seen last time: one C++ check, the launch
            if outputs is not None:
                return outputs
        return executor.run(self.complete_inputs(inputs, device=device), options, device)

    @property
    def last_run(self):
        """What the last execute() ran (pyfuser.runtime.executor.RunInfo), None before."""
        return self._executor.last_run if self._executor is not None else None

    def _first_executor(self):
        if not self._finalized:
            if self._failed:
                raise FusionDefinitionError(
                    f"execute: the definition failed ({self._failed}); define it again in a new "
                    "`with fd:` block (which starts from an empty fusion) or a new "
                    "FusionDefinition")
            raise FusionDefinitionError("execute: finish the definition (leave the `with` block) first")
        from ..runtime.executor import FusionExecutorCache
        self._executor = FusionExecutorCache(self.fusion, name=self.name)
        return self._executor

    def explain(self, inputs, *, device="h100", compile: bool = False):
        """The plan execute() would make for `inputs` on `device` (a device-table entry: "h100",
        "h200"), without a GPU: its segments, each kernel's heuristic and launch, and with
        `compile` the ptxas report. Inputs may be `meta` tensors. `print()` the result; see
        runtime/explain.py."""
        from ..runtime.explain import explain_fusion

        if not self._finalized:
            raise FusionDefinitionError("explain: finish the definition (leave the `with` block) first")
        if self.fusion.implicit_rng is not None:
            inputs = self.complete_inputs(inputs, rng_state=(0, 0), record=False)
        return explain_fusion(self.fusion, inputs, device=device, compile=compile, name=self.name)

    def kernels(self, last_run: bool = False) -> list:
        """The kernels execute() built so far (runtime.fusion_kernel.FusionKernel: `.name`,
        `.source`, `.stages`, `.module` once compiled), oldest first; with `last_run`, only
        those the last execute() ran. Empty before the first execute."""
        if self._executor is None:
            return []
        kernels = self._executor.kernels()
        if last_run:
            names = set(self.last_run.kernel_names) if self.last_run is not None else set()
            kernels = [k for k in kernels if k.name in names]
        return kernels

    def clone_fusion(self) -> Fusion:
        """A deep copy of the fusion, for scheduling by hand without touching this definition."""
        return clone_fusion(self.fusion)

    def __repr__(self) -> str:
        return f"FusionDefinition {self.name}\n{self.fusion}"


def clone_fusion(fusion: Fusion) -> Fusion:
    return fusion.clone()[0]


def _draw_rng_state(streams: int, inputs, device=None) -> tuple:
    """(seed, offset) for one execute of a fusion with `streams` implicit random ops: from the
    CUDA generator of the inputs' device (its seed, and its Philox offset, which this advances
    by 4 per stream, as torch's kernels advance it by 4 per draw per element), or, on the CPU, a
    seed drawn from the CPU generator (torch.manual_seed makes it repeat) and offset 0."""
    import torch

    tensors = [x.device for x in inputs if isinstance(x, torch.Tensor)]
    if tensors:
        device = tensors[0]
    elif device is not None:
        device = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if device is not None and device.type == "cuda":
        gen = torch.cuda.default_generators[device.index or 0]
        offset = gen.get_offset()
        gen.set_offset(offset + 4 * streams)
        # The seed is a uint64; an int64 scalar input holds the same 64 bits.
        seed = gen.initial_seed()
        return (seed - 2 ** 64 if seed >= 2 ** 63 else seed), offset
    return int(torch.randint(0, 2 ** 62, (1,)).item()), 0
