"""Kernel IR -> CUDA C++ text. A table from node kinds to text: no decisions are made here.

The device library (runtime_src/*.cuh) is pasted in front; it needs no CUDA header, so NVRTC
compiles the result with no include path.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir import scalar as S
from ..ir.dtype import DataType, compute_type
from ..ir.exprs import (BinaryOp, BinaryOpType, LinearOp, LoadStoreOp, MatmulOp, ReductionOp,
                        ScanOp, UnaryOp, UnaryOpType, WhereOp, WindowOp, BroadcastOp, ExpandOp,
                        SqueezeOp, ReshapeOp, FullOp, GatherOp, IndexCheckOp, IotaOp, RandOp,
                        ScatterOp, UNIFORM_BITS)
from ..ir.scalar import ScalarOp
from ..kir import nodes as K
from .device_library import device_library_source

CTYPE = {
    DataType.Bool: "bool", DataType.Int32: "int", DataType.Int: "long long",
    DataType.Half: "pf::half", DataType.BFloat16: "pf::bf16", DataType.Float: "float",
    DataType.Double: "double", DataType.Float8_e4m3fn: "pf::fp8e4m3",
    DataType.Float8_e5m2: "pf::fp8e5m2",
}
# Bool scalars travel as 32-bit ints: the launcher packs no 1-byte parameters.
PARAM_CTYPE = {"index": "index_t", "int64": "long long", "float": "float", "double": "double",
               "bool": "int"}

UNARY = {
    UnaryOpType.Neg: "(-{a})", UnaryOpType.Abs: "pf::abs({a})", UnaryOpType.Exp: "pf::exp({a})",
    UnaryOpType.Exp2: "pf::exp2({a})", UnaryOpType.Log: "pf::log({a})",
    UnaryOpType.Sqrt: "pf::sqrt({a})", UnaryOpType.Rsqrt: "pf::rsqrt({a})",
    UnaryOpType.Reciprocal: "pf::reciprocal({a})", UnaryOpType.Tanh: "pf::tanh({a})",
    UnaryOpType.Sigmoid: "pf::sigmoid({a})", UnaryOpType.Erf: "pf::erf({a})",
    UnaryOpType.Relu: "pf::relu({a})", UnaryOpType.Silu: "pf::silu({a})",
    UnaryOpType.GeluTanh: "pf::gelu_tanh({a})", UnaryOpType.GeluErf: "pf::gelu({a})",
    UnaryOpType.Not: "(!{a})", UnaryOpType.Cast: "{a}", UnaryOpType.Set: "{a}",
    UnaryOpType.ArgKeyIndex: "pf::arg_key_index({a})",
    UnaryOpType.LseKey: "pf::lse_key({a})", UnaryOpType.LseMax: "pf::lse_max({a})",
    UnaryOpType.LseSum: "pf::lse_sum({a})",
}
BINARY = {
    BinaryOpType.Add: "({a} + {b})", BinaryOpType.Sub: "({a} - {b})",
    BinaryOpType.Mul: "({a} * {b})", BinaryOpType.Div: "({a} / {b})",
    BinaryOpType.Pow: "pf::pow({a}, {b})", BinaryOpType.Max: "pf::maximum({a}, {b})",
    BinaryOpType.Min: "pf::minimum({a}, {b})", BinaryOpType.Eq: "({a} == {b})",
    BinaryOpType.Ne: "({a} != {b})", BinaryOpType.Lt: "({a} < {b})",
    BinaryOpType.Le: "({a} <= {b})", BinaryOpType.Gt: "({a} > {b})",
    BinaryOpType.Ge: "({a} >= {b})", BinaryOpType.And: "({a} && {b})",
    BinaryOpType.Or: "({a} || {b})",
    BinaryOpType.ArgMaxKey: "pf::arg_max_key({a}, {b})",
    BinaryOpType.ArgMinKey: "pf::arg_min_key({a}, {b})",
}
REDUCE = {"sum": "({a} + {b})", "max": "pf::maximum({a}, {b})", "min": "pf::minimum({a}, {b})",
          "logsumexp": "pf::lse_combine({a}, {b})"}
REDUCE_OP = {"sum": "pf::OpSum()", "max": "pf::OpMax()", "min": "pf::OpMin()",
             "prod": "pf::OpProd()", "logsumexp": "pf::OpLogSumExp()"}
# A scan's combine (op(earlier, later)), as a C expression.
SCAN = {"sum": "({a} + {b})", "prod": "({a} * {b})"}
SPECIAL = {
    "threadIdx.x": "pf_tidx", "threadIdx.y": "pf_tidy", "threadIdx.z": "pf_tidz",
    "blockIdx.x": "pf_bidx", "blockIdx.y": "pf_bidy", "blockIdx.z": "pf_bidz",
    "blockDim.x": "pf_bdimx", "gridDim.x": "pf_gdimx",
}


def ctype(dt: DataType) -> str:
    return CTYPE[dt]


class CudaPrinter:
    def __init__(self, kernel: K.Kernel):
        self.k = kernel
        self.lines: list[str] = []
        self.indent = 1
        self.ws_types: set = set()        # C types of block-reduction workspaces used
        self.cluster_types: set = set()   # C types of cluster-reduction slots used
        self.wgmma_shapes: set = set()    # (n, dtype) of the wgmma instructions printed
        # Tensors with a recomputed copy in this kernel (schedule/recompute.py).
        self._recompute_originals = {t.recompute_of for t in kernel.fusion.tensors()
                                     if t.recompute_of is not None}

    # Expressions ---------------------------------------------------------------------------
    def expr(self, e) -> str:
        if isinstance(e, K.Const):
            v = e.value
            if isinstance(v, bool):
                return "true" if v else "false"
            return str(v)
        if isinstance(e, K.Var):
            return e.name
        if isinstance(e, K.Special):
            return SPECIAL[e.name]
        if isinstance(e, K.Bin):
            a, b = self.expr(e.a), self.expr(e.b)
            if e.op == "ceilDiv":
                return f"pf::ceil_div({a}, {b})"
            if e.op in ("min", "max"):
                return f"pf::i{e.op}({a}, {b})"
            return f"({a} {e.op} {b})"
        if isinstance(e, K.Not):
            return f"(!{self.expr(e.a)})"
        if isinstance(e, K.Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"
        if isinstance(e, K.TensorIndex):
            return f"{e.buffer.name}[{self.expr(e.index)}]"
        raise TypeError(f"cannot print {e!r}")

    def scalar(self, s, want: str) -> str:
        """A fusion scalar as a C expression of C type `want`."""
        if s.value is not None:
            return literal(s.value, want)
        names = self.k.ctx.names
        if s in names:
            return convert(self.expr(names[s]), want)
        d = s.definition
        if isinstance(d, ScalarOp):
            a = self.scalar(d.inputs[0], "index_t")
            b = self.scalar(d.inputs[1], "index_t")
            text = {"ceilDiv": f"pf::ceil_div({a}, {b})", "max": f"pf::imax({a}, {b})",
                    "min": f"pf::imin({a}, {b})"}.get(d.op, f"({a} {ScalarOp.SYMBOLS.get(d.op, d.op)} {b})")
            return convert(text, want)
        # An op's value is converted to the scalar's own type first, as a tensor op's value is
        # stored to its buffer: a cast to int64 truncates, a cast to bf16 rounds, even where the
        # reader wants a double.
        own = ctype(s.dtype)
        if isinstance(d, UnaryOp):
            a = self.scalar(d.inputs[0], unary_ctype(d))
            text = UNARY[d.op].format(a=a)
            src = unary_ctype(d) if d.op in (UnaryOpType.Cast, UnaryOpType.Set) else None
            return convert(convert(text, own, src), want, own)
        if isinstance(d, BinaryOp):
            ct, ct_b = binary_ctypes(d)
            a = self.scalar(d.inputs[0], ct)
            b = self.scalar(d.inputs[1], ct_b)
            return convert(convert(BINARY[d.op].format(a=a, b=b), own), want, own)
        raise ValueError(f"cannot print scalar {S.scalar_str(s)}")

    def value(self, operand, want: str) -> str:
        """Read an operand (indexed tensor or scalar) as C type `want`."""
        if isinstance(operand, K.TensorIndex):
            return f"pf::cast<{want}>({self.expr(operand)})"
        if isinstance(operand, K.ScalarValue):
            return self.scalar(operand.scalar, want)
        raise TypeError(f"cannot read {operand!r}")

    # Statements ----------------------------------------------------------------------------
    def line(self, text: str) -> None:
        self.lines.append("  " * self.indent + text)

    def stmts(self, body) -> None:
        for s in body:
            self.stmt(s)

    def stmt(self, s) -> None:
        fn = getattr(self, "_" + type(s).__name__)
        fn(s)

    def _Comment(self, s):
        self.line(f"// {s.text}")

    def _Raw(self, s):
        self.line(s.text)

    def _ScalarDef(self, s):
        self.line(f"const {PARAM_CTYPE.get(s.var.dtype, 'index_t')} {s.var.name} = {self.expr(s.value)};")

    def _CheckedQuotients(self, s):
        self.line("{  // quotients through the shared divisor's reciprocal (lower/shared_divisor.py)")
        self.indent += 1
        self.line(f"bool {s.flag} = true;")
        self.stmts(s.fast)
        self.line(f"if (!{s.flag}) {{")
        self.indent += 1
        self.stmts(s.exact)
        self.indent -= 1
        self.line("}")
        self.indent -= 1
        self.line("}")

    def _LseFoldLanes(self, s):
        lanes = ", ".join(self.expr(x) for x in s.lanes)
        self.line(f"{{  const float pf_lanes[{len(s.lanes)}] = {{{lanes}}};")
        self.line(f"   {self.expr(s.out)} = pf::lse_fold_lanes({self.expr(s.acc)}, pf_lanes);  }}")

    def _Allocate(self, s):
        b = s.buffer
        if b.memory == "local":
            self.line(f"{ctype(b.dtype)} {b.name}[{self.expr(b.size)}] __attribute__((aligned(16)));")
        elif b.memory == "shared":
            off = self.k.smem_offsets[b.name]
            self.line(f"{ctype(b.dtype)}* {b.name} = reinterpret_cast<{ctype(b.dtype)}*>("
                      f"{_SMEM_BASE if self.k.smem_align > 128 else 'pf_smem'} + {off});")

    def _ForLoop(self, s):
        if s.label:
            self.line(f"// {s.label}")
        if s.parallel in ("TIDx", "TIDy", "TIDz", "BIDx", "BIDy", "BIDz"):
            self.line(f"{{  // {s.parallel} over {self.expr(s.stop)}")
        elif s.parallel == "GridStride":
            v = s.var.name
            self.line(f"for (index_t {v} = pf_bidx; {v} < {self.expr(s.stop)}; {v} += pf_gdimx) {{")
        else:
            if s.unroll:
                self.line("#pragma unroll")
            elif s.rolled:
                self.line("#pragma unroll 1")
            v = s.var.name
            one = isinstance(s.step, K.Const) and s.step.value == 1
            step = f"++{v}" if one else f"{v} += {self.expr(s.step)}"
            self.line(f"for (index_t {v} = {self.expr(s.start)}; {v} < {self.expr(s.stop)}; "
                      f"{step}) {{")
        self.indent += 1
        self.stmts(s.body)
        self.indent -= 1
        self.line("}")

    def _IfThenElse(self, s):
        self.line(f"if ({self.expr(s.cond)}) {{")
        self.indent += 1
        self.stmts(s.then_body)
        self.indent -= 1
        if s.else_body:
            self.line("} else {")
            self.indent += 1
            self.stmts(s.else_body)
            self.indent -= 1
        self.line("}")

    def _RoleSplit(self, s):
        """The roles as one if / else if / else chain over their conditions."""
        for k, rb in enumerate(s.roles):
            if rb.cond is None:
                if k != len(s.roles) - 1 or k == 0:
                    raise ValueError("only the last warp role may be unconditional")
                self.line("} else {")
            else:
                self.line(("if" if k == 0 else "} else if") + f" ({self.expr(rb.cond)}) {{")
            self.indent += 1
            self.stmts(rb.body)
            self.indent -= 1
        self.line("}")

    def _NamedBarrierArrive(self, s):
        self.line(f"pf::named_barrier_arrive({s.barrier_id}, {self.expr(s.count)});")

    def _InitValue(self, s):
        b = s.out
        v = self.value(s.value, ctype(b.dtype))
        size = self.expr(b.size)
        if b.memory == "shared":
            # The block fills a shared accumulator together; a barrier before any thread adds.
            self.line("for (index_t pf_k = pf_tidx + pf_bdimx * (pf_tidy + (index_t)blockDim.y * pf_tidz); "
                      f"pf_k < {size}; pf_k += pf_bdimx * (index_t)blockDim.y * (index_t)blockDim.z) "
                      f"{b.name}[pf_k] = {v};")
            self.line("__syncthreads();")
            return
        if size == "1":
            self.line(f"{b.name}[0] = {v};")
        else:
            self.line("#pragma unroll")
            self.line(f"for (int pf_k = 0; pf_k < {size}; ++pf_k) {b.name}[pf_k] = {v};")

    def _TensorOp(self, s):
        text = self.op_text(s)
        if K.is_true(s.predicate):
            self.line(text)
        else:
            self.line(f"if ({self.expr(s.predicate)}) {{")
            self.indent += 1
            self.line(text)
            self.indent -= 1
            self.line("}")

    def op_text(self, s: K.TensorOp) -> str:
        e = s.expr
        out = s.out
        odt = out.buffer.dtype
        if s.vector > 1 and isinstance(e, GatherOp):
            return self.gather_text(s)
        if s.vector > 1 and isinstance(e, RandOp):
            return self.random_text(s)
        if s.vector > 1:
            return self.vector_copy(s)
        oct_ = ctype(odt)
        if isinstance(e, ScanOp):
            return self.scan_text(s)
        if isinstance(e, ReductionOp):
            ct = _compute_ctype(odt)
            acc = self.value(out, ct)
            val = self.value(s.ins[0], ct)
            return f"{self.expr(out)} = pf::cast<{oct_}>({REDUCE[e.op.value].format(a=acc, b=val)});"
        if isinstance(e, UnaryOp):
            src_dt = e.inputs[0].dtype
            if (e.op == UnaryOpType.Cast and getattr(e, "is_recompute", False)
                    and src_dt.is_reduced_float and isinstance(s.ins[0], K.TensorIndex)):
                widen = "pf_opaque_widen"
                return f"{self.expr(out)} = pf::cast<{oct_}>({widen}({self.expr(s.ins[0])}));"
            ct = unary_ctype(e)
            return f"{self.expr(out)} = pf::cast<{oct_}>({UNARY[e.op].format(a=self.value(s.ins[0], ct))});"
        if isinstance(e, BinaryOp):
            ct, ct_b = binary_ctypes(e)
            a, b = self.value(s.ins[0], ct), self.value(s.ins[1], ct_b)
            if e.op in (BinaryOpType.Eq, BinaryOpType.Ne) and ct == "long long":
                # Half by half: where one half is the same along a loop (an int64 target
                # against a 32-bit iota index, whose high half is 0) the compiler tests it once.
                eq = f"pf::eq_by_halves({a}, {b})"
                return f"{self.expr(out)} = pf::cast<{oct_}>({eq if e.op == BinaryOpType.Eq else '!' + eq});"
            if s.quotient_flag is not None:
                return (f"{self.expr(out)} = pf::cast<{oct_}>(pf::div_shared_divisor({a}, {b}, "
                        f"{s.quotient_flag}));")
            if (e.op == BinaryOpType.Mul and ct in ("float", "double")
                    and self._computed_twice(e.outputs[0])):
                return f"{self.expr(out)} = pf::cast<{oct_}>(pf::mul_rn({a}, {b}));"
            return f"{self.expr(out)} = pf::cast<{oct_}>({BINARY[e.op].format(a=a, b=b)});"
        if isinstance(e, WhereOp):
            ct = _compute_ctype(odt)
            c = self.value(s.ins[0], "bool")
            a, b = self.value(s.ins[1], ct), self.value(s.ins[2], ct)
            return f"{self.expr(out)} = pf::cast<{oct_}>({c} ? {a} : {b});"
        if isinstance(e, (LoadStoreOp, BroadcastOp, ExpandOp, SqueezeOp, ReshapeOp)):
            src = s.ins[0]
            if isinstance(src, K.TensorIndex) and src.buffer.dtype == odt:
                return f"{self.expr(out)} = {self.expr(src)};"
            return f"{self.expr(out)} = pf::cast<{oct_}>({self.value(src, _compute_ctype(odt))});"
        if isinstance(e, FullOp):
            return f"{self.expr(out)} = {self.value(s.ins[0], oct_)};"
        if isinstance(e, (MatmulOp, LinearOp)):
            # A matmul's element in a fused epilogue (lower/matmul.py): the fp32 accumulator,
            # plus a linear's bias, converted once.
            terms = " + ".join(self.value(x, "float") for x in s.ins)
            return f"{self.expr(out)} = pf::cast<{oct_}>({terms});"
        if isinstance(e, WindowOp):
            # A window's out has its source's dtype (arith.window): a plain read.
            src, cond, fill = s.ins
            if K.is_true(cond):
                return f"{self.expr(out)} = {self.expr(src)};"
            return (f"{self.expr(out)} = ({self.expr(cond)}) ? {self.expr(src)} : "
                    f"{self.value(fill, oct_)};")
        if isinstance(e, GatherOp):
            return self.gather_text(s)
        if isinstance(e, IndexCheckOp):
            return self.check_index_text(s)
        if isinstance(e, ScatterOp):
            return self.scatter_text(s)
        if isinstance(e, RandOp):
            return self.random_text(s)
        if isinstance(e, IotaOp):
            ct = _compute_ctype(odt)
            start, step = (self.value(x, ct) for x in s.ins[:2])
            index = self.expr(s.ins[2])
            if ct == "long long" and self.k.index_type == "int":
                # An element's index counts up from 0 (a pad's window may compute it below 0
                # where it reads the fill instead): widened as unsigned, its high word is 0,
                # so the compare of an int64 iota with a value held across the loop (a one-hot
                # against a row's target) tests that value's high word once, not per element.
                index = f"static_cast<unsigned>({index})"
            index = f"static_cast<{ct}>({index})"
            return f"{self.expr(out)} = pf::cast<{oct_}>({start} + {index} * {step});"
        raise NotImplementedError(f"codegen: no rule for {type(e).__name__}")

    def scan_text(self, s: K.TensorOp) -> str:
        """A scan step (`carry = op(carry, in); out = carry`) or, after the block scan, its fixup
        (`out = op(carry, in)`, carry the exclusive prefix): lower/scans.py."""
        if s.carry is None:
            raise NotImplementedError("codegen: a scan left without its carry (lower_scans)")
        t = ctype(s.carry.buffer.dtype)
        ct = _compute_ctype(s.carry.buffer.dtype)
        carry, val = self.expr(s.carry), self.value(s.ins[0], ct)
        combined = SCAN[s.expr.op].format(a=self.value(s.carry, ct), b=val)
        if s.scan_fixup:
            return f"{self.expr(s.out)} = pf::cast<{ctype(s.out.buffer.dtype)}>({combined});"
        return (f"{carry} = pf::cast<{t}>({combined}); "
                f"{self.expr(s.out)} = {carry};")

    def _BlockScan(self, s):
        """Exclusive block scan of the carry (scan.cuh); with a cluster, the lower-ranked CTAs'
        totals in front; chained, the prefix of the blocks before along blockIdx.y."""
        bx = self.k.launch.block[0]
        bx = bx if isinstance(bx, int) else bx.value
        if bx is None or bx % 32:
            raise ValueError(f"a block scan needs a static block x of whole warps, got {bx}")
        t = ctype(s.dtype)
        self.ws_types.add(t)
        op = REDUCE_OP[s.op]
        carry = self.expr(s.carry)
        ws = f"pf_red_ws_{t.replace(' ', '_')}"
        self.line("{")
        self.line(f"  {t} pf_scan_total;")
        self.line(f"  {carry} = pf::block_exclusive_scan_x({carry}, {ws}, {op}, pf_scan_total);")
        if s.cluster is not None:
            dim, size = s.cluster
            if dim != "y":
                raise NotImplementedError("codegen: a cluster scan along blockIdx.y only")
            self.cluster_types.add(t)
            self.line(f"  {carry} = {op}(pf::cluster_exclusive_scan_row<{size}>(pf_scan_total, "
                      f"pf_cluster_slots_{t.replace(' ', '_')}, {self.rows()}, pf_cluster_phase, "
                      f"{op}), {carry});")
        elif s.chain is not None:
            values, flags = s.chain
            self.line(f"  {carry} = {op}(pf::chained_exclusive_scan_row(pf_scan_total, "
                      f"{values.name}, reinterpret_cast<unsigned long long*>({flags.name}), {ws}, "
                      f"{op}), "
                      f"{carry});")
        else:
            self.line("  (void)pf_scan_total;")
        self.line("}")

    def _BlockTopK(self, s):
        """The block top-k of the rows the threads hold (topk.cuh)."""
        if s.values.dtype != s.chunk.dtype:
            raise NotImplementedError("codegen: a top-k's values in another dtype than its row")
        self.line(f"pf::block_topk_x<{s.chunk_size}, {self.expr(s.values.size)}, {s.stride}, "
                  f"{s.k}, {'true' if s.largest else 'false'}>({s.chunk.name}, "
                  f"static_cast<long long>({self.expr(s.extent)}), {s.values.name}, "
                  f"{s.indices.name}, {s.workspace.name});")

    def random_text(self, s: K.TensorOp) -> str:
        """A random op's draw at its row-major index (ins: seed, offset, the two parameters,
        the index); a vector of them (lower/vectorize.py: consecutive indices from a multiple
        of 4) shares one Philox block per 4 uniform (2 normal) draws."""
        e, out = s.expr, s.out
        odt = out.buffer.dtype
        oct_ = ctype(odt)
        seed, offset, a, b = (self.value(x, t) for x, t in zip(
            s.ins[:4], ("long long", "long long", "double", "double")))
        index = f"static_cast<long long>({self.expr(s.ins[4])})"
        # The stream's counter: offset / 4 (torch's steps of 4 draws) + the op's stream.
        args = f"{seed}, ({offset} >> 2) + {e.stream}, {a}, {b}"
        if s.vector > 1:
            draw = (f"pf::philox_uniform_vec<{oct_}, {UNIFORM_BITS[odt.value[0]]}, {s.vector}>"
                    if e.dist == "uniform" else f"pf::philox_normal_vec<{oct_}, {s.vector}>")
            return f"{draw}(&{self.expr(out)}, {index}, {args});"
        draw = (f"pf::philox_uniform<{oct_}, {UNIFORM_BITS[odt.value[0]]}>"
                if e.dist == "uniform" else "pf::philox_normal")
        return f"{self.expr(out)} = pf::cast<{oct_}>({draw}({index}, {args}));"

    def gather_text(self, s: K.TensorOp) -> str:
        """A gather's read (lower/index._gather_read): the index checked against its dim, the
        source read at it where it is in range, 0 and a report (pf::report_index_error) where
        not. A gather's out has its source's dtype (arith.gather): a plain read."""
        src, index, stride, extent, record, report, check = s.ins
        i, zero = K.GATHER_INDEX, f"pf::cast<{ctype(s.out.buffer.dtype)}>(0)"
        if s.vector > 1:        # one index for all lanes, one vector read (lower/vectorize.py)
            read = self.vector_move(s.out, K.gathered_at(src, stride), s.vector)
            fill = self.fill_lanes(s.out, s.vector, zero)
        else:
            read = f"{self.expr(s.out)} = {self.expr(K.gathered_at(src, stride))};"
            fill = f"{self.expr(s.out)} = {zero};"
        return (f"{{ const long long {i} = static_cast<long long>({self.expr(index)}); "
                f"if ({i} >= 0 && {i} < static_cast<long long>({self.expr(extent)})) {{ {read} }} "
                f"else {{ {fill} "
                f"pf::report_index_error(&{self.expr(record)}, &{self.expr(report)}, "
                f"{self.expr(check)}, {i}); }} }}")

    def check_index_text(self, s: K.TensorOp) -> str:
        """An index check (lower/index.py): out = index; an index outside [0, extent) is
        reported (pf::report_index_error)."""
        index, extent, record, report, check = s.ins
        i = K.GATHER_INDEX
        return (f"{{ const long long {i} = static_cast<long long>({self.expr(index)}); "
                f"{self.expr(s.out)} = {self.expr(index)}; "
                f"if ({i} < 0 || {i} >= static_cast<long long>({self.expr(extent)})) "
                f"pf::report_index_error(&{self.expr(record)}, &{self.expr(report)}, "
                f"{self.expr(check)}, {i}); }}")

    def scatter_text(self, s: K.TensorOp) -> str:
        """A scatter's add (lower/index._scatter_write): the index checked against the dim it
        writes, the value added atomically into out at it (pf::atomic_add) where it is in
        range, a report (pf::report_index_error) where not."""
        if s.expr.op != "add":
            raise NotImplementedError("codegen: a scatter that stores (only adds are kernels)")
        src, index, stride, extent, record, report, check = s.ins
        i = K.GATHER_INDEX
        t = ctype(s.out.buffer.dtype)
        value = self.value(src, t)
        return (f"{{ const long long {i} = static_cast<long long>({self.expr(index)}); "
                f"if ({i} >= 0 && {i} < static_cast<long long>({self.expr(extent)})) {{ "
                f"pf::atomic_add(&{self.expr(K.gathered_at(s.out, stride))}, {value}); }} "
                f"else {{ pf::report_index_error(&{self.expr(record)}, &{self.expr(report)}, "
                f"{self.expr(check)}, {i}); }} }}")

    def _computed_twice(self, tv) -> bool:
        """Whether the kernel computes tv's value in two places: tv is a recomputed copy
        (schedule/recompute.py) or the original of one."""
        return tv.recompute_of is not None or tv in self._recompute_originals

    def vector_copy(self, s: K.TensorOp) -> str:
        out, src, v = s.out, s.ins[0], s.vector
        move = self.vector_move(out, src, v)
        if isinstance(s.expr, WindowOp) and not K.is_true(s.ins[1]):
            # A vector of a window: all lanes read, or all take the fill (whole-vector guards).
            fill = self.value(s.ins[2], ctype(out.buffer.dtype))
            return (f"if ({self.expr(s.ins[1])}) {{ {move} }} else {{ "
                    f"{self.fill_lanes(out, v, fill)} }}")
        return move

    def fill_lanes(self, out: K.TensorIndex, v: int, value: str) -> str:
        """The v elements of a vector access `out` set to `value` one by one (a window's fill,
        a gather's 0 at an index out of range)."""
        return f"for (int pf_l = 0; pf_l < {v}; ++pf_l) (&{self.expr(out)})[pf_l] = {value};"

    def vector_move(self, out: K.TensorIndex, src: K.TensorIndex, v: int) -> str:
        """One v-wide copy from src to out, by the memories they are in."""
        t = ctype(out.buffer.dtype)
        arr = f"pf::Array<{t}, {v}>"
        dst_mem, src_mem = out.buffer.memory, src.buffer.memory
        if dst_mem == "local" and src_mem == "global":
            hint = "pf::LoadHint::Default"
            if _is_input(self.k, src.buffer):
                streamed = self.k.streaming_loads or src.buffer.tv in self.k.fusion.streamed_inputs
                hint = "pf::LoadHint::ReadOnlyNoAllocate" if streamed else "pf::LoadHint::ReadOnly"
            return (f"pf::load_global_vec<{hint}>(*reinterpret_cast<{arr}*>(&{self.expr(out)}), "
                    f"&{self.expr(src)});")
        if dst_mem == "global" and src_mem == "local":
            return (f"pf::store_global_vec(&{self.expr(out)}, "
                    f"*reinterpret_cast<const {arr}*>(&{self.expr(src)}));")
        if dst_mem == "local" and src_mem == "shared":
            return (f"pf::load_shared_vec(*reinterpret_cast<{arr}*>(&{self.expr(out)}), "
                    f"&{self.expr(src)});")
        if dst_mem == "shared" and src_mem == "local":
            return (f"pf::store_shared_vec(&{self.expr(out)}, "
                    f"*reinterpret_cast<const {arr}*>(&{self.expr(src)}));")
        return (f"*reinterpret_cast<{arr}*>(&{self.expr(out)}) = "
                f"*reinterpret_cast<const {arr}*>(&{self.expr(src)});")

    def _BlockReduce(self, s):
        sync = "" if s.barrier is None else f", pf::NamedBarrier{{{s.barrier[0]}, {s.barrier[1]}}}"
        self._grouped_allreduce(s, s.dims, sync, s.workspace_offset)

    def _grouped_allreduce(self, s, dims, sync: str = "", offset: int = 0):
        """Block all-reduce over thread `dims` of the registers of block or grid step `s`'s
        values (TensorIndexes of `vector` values each): one value's in place; siblings'
        (lower/grouped_reductions.py) gathered into one array, reduced in one pass, and
        scattered back."""
        values, t, op = s.values, ctype(s.dtype), s.op
        if len(values) == 1:
            self._block_allreduce(self.expr(values[0]), values[0].vector, t, op, dims, sync,
                                  offset)
            return
        total = K.reduced_values(s)
        self.line("{")
        self.indent += 1
        self.line(f"{t} pf_grp[{total}];")
        for v, at in zip(values, _offsets(values)):
            self.line("#pragma unroll")
            self.line(f"for (int pf_k = 0; pf_k < {v.vector}; ++pf_k) pf_grp[{at} + pf_k] = "
                      f"{v.buffer.name}[{self.expr(v.index)} + pf_k];")
        self._block_allreduce("pf_grp[0]", total, t, op, dims, sync, offset)
        for v, at in zip(values, _offsets(values)):
            self.line("#pragma unroll")
            self.line(f"for (int pf_k = 0; pf_k < {v.vector}; ++pf_k) "
                      f"{v.buffer.name}[{self.expr(v.index)} + pf_k] = pf_grp[{at} + pf_k];")
        self.indent -= 1
        self.line("}")

    def _block_allreduce(self, value: str, count: int, t: str, op: str, dims, sync: str = "",
                         offset: int = 0):
        """Block all-reduce of `count` values of type `t` starting at lvalue `value` over the
        thread dims `dims` (the device library's, in its shared-memory workspace of type t, from
        element `offset`: a compute role's own copy)."""
        ws = f"pf_red_ws_{t.replace(' ', '_')}"
        bx, by, bz = (b if isinstance(b, int) else b.value for b in self.k.launch.block)
        if not sync and by == bz == 1 and bx is not None and bx > 32 and bx % 32:
            # One row of whole warps and a partial one: reduce.cuh's two-barrier path.
            sync = f", pf::OneRowBarrier<{bx}>()"
        if offset:
            ws = f"({ws} + {offset})"
        self.ws_types.add(t)
        for dim in dims:
            if count == 1:
                self.line(f"{value} = pf::block_allreduce_{dim}({value}, {ws}, "
                          f"{REDUCE_OP[op]}{sync});")
            else:
                self.line(f"pf::block_allreduce_{dim}_group<{count}>(*reinterpret_cast<{t}(*)"
                          f"[{count}]>(&{value}), {ws}, {REDUCE_OP[op]}{sync});")

    # Asynchronous copies and mbarriers --------------------------------------------------------
    def bar(self, ref: K.MBarrierRef) -> str:
        return f"pf::smem_addr(&{ref.bars.name}[{self.expr(ref.index)}])"

    def _MBarrierAlloc(self, s):
        self.line(f"__shared__ __align__(8) unsigned long long {s.bars.name}[{s.bars.count}];")

    def _MBarrierInit(self, s):
        self.line(f"pf::mbarrier_init({self.bar(s.bar)}, {self.expr(s.arrivals)});")

    def _FenceMBarrierInit(self, s):
        self.line("pf::fence_mbarrier_init();")

    def _MBarrierArrive(self, s):
        if s.cta is None:
            self.line(f"pf::mbarrier_arrive({self.bar(s.bar)});")
        else:
            self.line(f"pf::mbarrier_arrive_peer({self.bar(s.bar)}, {self.expr(s.cta)});")

    def _ClusterSync(self, s):
        self.line("pf::cluster_sync();")

    def _MBarrierWait(self, s):
        self.line(f"pf::mbarrier_wait_parity({self.bar(s.bar)}, {self.expr(s.parity)});")

    def _MBarrierInval(self, s):
        self.line(f"pf::mbarrier_inval({self.bar(s.bar)});")

    def guarded(self, predicate, lines) -> None:
        """`lines`, under `if (predicate)` unless it is always true."""
        guard = not K.is_true(predicate)
        if guard:
            self.line(f"if ({self.expr(predicate)}) {{")
            self.indent += 1
        for text in lines:
            self.line(text)
        if guard:
            self.indent -= 1
            self.line("}")

    def _BulkLoad(self, s):
        self.guarded(s.predicate, [
            f"pf::mbarrier_expect_tx({self.bar(s.bar)}, {self.expr(s.bytes)});",
            f"pf::bulk_copy_g2s(pf::smem_addr(&{self.expr(s.dst)}), &{self.expr(s.src)}, "
            f"{self.expr(s.bytes)}, {self.bar(s.bar)});"])

    def _TensorMapLoad(self, s):
        coords = ", ".join(f"(int)({self.expr(c)})" for c in s.coords)
        expected, form, mask = self.expr(s.bytes), "", ""
        if s.multicast > 1:
            if not 2 <= len(s.coords) <= 5:
                raise NotImplementedError(f"codegen: a multicast tensor-map copy of a "
                                          f"{len(s.coords)}-D box")
            # Every CTA of the cluster multicasts its share of the same size: this barrier
            # receives all of them.
            expected = f"({expected}) * {s.multicast}"
            form, mask = "_multicast", f", (unsigned short){(1 << s.multicast) - 1}u"
        self.guarded(s.predicate, [
            f"pf::mbarrier_expect_tx({self.bar(s.bar)}, {expected});",
            f"pf::tma_load_{len(s.coords)}d{form}(pf::smem_addr(&{self.expr(s.dst)}), "
            f"&{s.tmap.name}, {coords}, {self.bar(s.bar)}{mask});"])

    def _CpAsyncCopy(self, s):
        self.guarded(s.predicate, [f"pf::cp_async<{s.bytes}>(pf::smem_addr(&{self.expr(s.dst)}), "
                                   f"&{self.expr(s.src)});"])

    def _CpAsyncCommit(self, s):
        self.line("pf::cp_async_commit_group();")

    def _CpAsyncWait(self, s):
        self.line(f"pf::cp_async_wait_group<{s.pending}>();")

    def _ClusterReduce(self, s):
        acc = s.values[0]
        if acc.vector != 1:
            raise ValueError("a cluster reduction takes one value per row (no grouped values)")
        t = ctype(s.dtype)
        self.cluster_types.add(t)
        self.line(f"{self.expr(acc)} = pf::cluster_allreduce_row<{s.size}>({self.expr(acc)}, "
                  f"pf_cluster_slots_{t.replace(' ', '_')}, {self.rows()}, pf_cluster_phase, "
                  f"{REDUCE_OP[s.op]});")

    def rows(self) -> int:
        by = self.k.launch.block[1]
        by = by if isinstance(by, int) else by.value
        if by is None:
            raise ValueError("a cluster reduction needs a constant block y extent")
        return by

    # Tensor-core matmul ------------------------------------------------------------------------
    def _Wgmma(self, s):
        if s.swizzle != 128:
            raise ValueError(f"wgmma operands with a {s.swizzle}-byte swizzle are not printed")
        size = s.acc.size.value if isinstance(s.acc.size, K.Const) else None
        if size != s.n // 2:
            raise ValueError(f"wgmma m64n{s.n}: its accumulator {s.acc.name} holds {size} "
                             f"registers per thread, not {s.n // 2}")
        trans_a, trans_b = s.a_major == "MN", s.b_major == "MN"
        self.wgmma_shapes.add((s.n, s.dtype, trans_a, trans_b))
        scale = self.expr(s.scale_d)

        def desc(operand, mn: bool, chunk: int) -> str:
            addr = f"pf::smem_addr(&{self.expr(operand)})"
            return f"pf::wgmma_desc_sw128_mn({addr}, {chunk})" if mn else \
                f"pf::wgmma_desc_sw128({addr})"
        self.line(f"{_wgmma_name(s.n, s.dtype, trans_a, trans_b)}({s.acc.name}, "
                  f"{desc(s.a, trans_a, K.A_MN_CHUNK_BYTES)}, "
                  f"{desc(s.b, trans_b, s.b_chunk_bytes)}, (int)({scale}));")

    def _WgmmaFence(self, s):
        self.line("pf::wgmma_fence();")

    def _WgmmaCommit(self, s):
        self.line("pf::wgmma_commit();")

    def _WgmmaWait(self, s):
        self.line(f"pf::wgmma_wait<{s.pending}>();")

    def _AccumulatorFence(self, s):
        self.line("#pragma unroll")
        self.line(f"for (int pf_k = 0; pf_k < {self.expr(s.acc.size)}; ++pf_k) "
                  f"asm volatile(\"\" : \"+f\"({s.acc.name}[pf_k]) :: \"memory\");")

    def _SplitKReduce(self, s):
        """Split-K's partials of one warp group (kir SplitKReduce's layout and protocol)."""
        if s.whole is not None:
            return self._stream_k_reduce(s)
        regs, splits = s.registers, s.splits
        part = regs * 128                   # floats of one partial: [pair][thread][2]
        sync = self._partials_sync(s)
        last = s.last.name
        self.line(f"bool {last};")
        self.line("{  // split-K: this warp group's partial sums; the last of the tile's "
                  f"{splits} sums them in split order")
        self.indent += 1
        self.line(f"const index_t pf_sk_slot = {self.expr(s.slot)};")
        self.line(f"float* const pf_sk_mine = {s.partials.name} + (pf_sk_slot * {splits} + "
                  f"({self.expr(s.split)})) * {part};")
        self.line(f"const index_t pf_sk_row = {self.expr(s.frag_row)};")

        def valid(sl: int, i: str) -> str:
            return f"pf_sk_row + 8 * (({i} >> 1) & 1) < pf_sk_rows{sl}"

        def at(off: int, i: str) -> str:   # the float offset of register pair i in a partial
            return f"((({off} + {i}) >> 1) * 128 + (index_t)threadIdx.x) * 2"
        offsets, off = [], 0
        for sl, (acc, rows) in enumerate(zip(s.accs, s.rows)):
            offsets.append(off)
            n = acc.size.value
            self.line(f"const index_t pf_sk_rows{sl} = {self.expr(rows)};")
            self.line("#pragma unroll")
            self.line(f"for (int pf_i = 0; pf_i < {n}; pf_i += 2)")
            self.line(f"  if ({valid(sl, 'pf_i')}) pf::store_f32x2(pf_sk_mine + {at(off, 'pf_i')}, "
                      f"{acc.name}[pf_i], {acc.name}[pf_i + 1]);")
            off += n
        self.line("__threadfence();")
        self.line(sync)
        self.line("__shared__ int pf_sk_last[8];   // by warp group (the hardware threadIdx.y)")
        self.line("if (threadIdx.x == 0) {")
        self.line(f"  const unsigned pf_prev = atomicAdd(reinterpret_cast<unsigned*>("
                  f"&{s.counters.name}[pf_sk_slot]), 1u);")
        self.line(f"  pf_sk_last[threadIdx.y] = pf_prev == {splits - 1}u;")
        self.line(f"  if (pf_prev == {splits - 1}u) {s.counters.name}[pf_sk_slot] = 0;  "
                  "// ready for the next launch")
        self.line("}")
        self.line(sync)
        self.line(f"{last} = pf_sk_last[threadIdx.y] != 0;")
        self.line(f"if ({last}) {{")
        self.indent += 1
        self.line("__threadfence();")
        self.line(f"const float* const pf_sk_all = {s.partials.name} + pf_sk_slot * "
                  f"{splits * part};")
        for sl, acc in enumerate(s.accs):
            self.line("#pragma unroll")
            self.line(f"for (int pf_i = 0; pf_i < {acc.size.value}; ++pf_i) "
                      f"{acc.name}[pf_i] = 0.f;")
        # 8-byte reads of groups of registers (partial_reads), a batch of partials' reads issued
        # before their adds, in split order (each register's sum the same bits whichever CTA is last).
        group, batch = partial_reads(regs, SPLIT_K_READS_IN_FLIGHT * 2, splits,
                                     SPLIT_K_READS_FLOATS, SPLIT_K_READ_REGISTERS)
        self._partials_added(
            s, "int", "0", str(splits), part, offsets, lambda n: min(group, n), batch,
            (2, lambda sl, acc, off: f"if ({valid(sl, '(pf_g + pf_j)')}) pf::load_cg_f32x2("
                                     f"pf_sk_p + {at(off, '(pf_g + pf_j)')}, pf_v[pf_j], "
                                     "pf_v[pf_j + 1]);"),
            (2, lambda sl, acc: f"if ({valid(sl, '(pf_g + pf_j)')}) {{ {acc.name}[pf_g + pf_j] "
                                f"+= pf_v[pf_j]; {acc.name}[pf_g + pf_j + 1] += "
                                "pf_v[pf_j + 1]; }"))
        self.indent -= 1
        self.line("}")
        self.indent -= 1
        self.line("}")

    def _stream_k_reduce(self, s):
        """Stream-K's partials of one warp group (kir SplitKReduce with `whole`): split 0 of a
        tile waits for the others' and adds them to its registers in split order. A partial
        holds every register (rows past the matrix too: zeros), four per 16-byte access, laid
        out [quad][thread][4]; STREAM_K_READS_IN_FLIGHT of them per thread are read before
        their adds."""
        stride = s.splits
        part = s.registers * 128            # floats of one partial
        sync = self._partials_sync(s)
        last = s.last.name
        self.line(f"bool {last} = true;")
        self.line(f"if (!({self.expr(s.whole)})) {{  // stream-K: a run of the tile's k blocks")
        self.indent += 1
        self.line(f"const index_t pf_sk_split = {self.expr(s.split)};")
        self.line(f"const unsigned pf_sk_arrivals = {self.expr(s.arrivals)};")
        self.line(f"float* const pf_sk_all = {s.partials.name} + ({self.expr(s.slot)}) * "
                  f"{stride * part};")
        self.line(f"unsigned* const pf_sk_count = reinterpret_cast<unsigned*>("
                  f"&{s.counters.name}[{self.expr(s.slot)}]);")

        def at(off: int, i: str) -> str:   # the float offset of register quad i in a partial
            return f"((({off} + {i}) >> 2) * 128 + (index_t)threadIdx.x) * 4"
        offsets, off = [], 0
        for acc in s.accs:
            offsets.append(off)
            off += acc.size.value
        # A later run of the tile (its CTA's first, finished early): its partial, published by
        # the release of its arrival (the barrier orders the warp group's stores before it).
        self.line("if (pf_sk_split != 0) {")
        self.indent += 1
        self.line(f"float* const pf_sk_mine = pf_sk_all + pf_sk_split * {part};")
        for acc, off in zip(s.accs, offsets):
            a = acc.name
            self.line("#pragma unroll")
            self.line(f"for (int pf_i = 0; pf_i < {acc.size.value}; pf_i += 4)")
            self.line(f"  pf::store_f32x4(pf_sk_mine + {at(off, 'pf_i')}, {a}[pf_i], "
                      f"{a}[pf_i + 1], {a}[pf_i + 2], {a}[pf_i + 3]);")
        self.line(sync)
        self.line("if (threadIdx.x == 0) pf::grid_arrive(pf_sk_count);")
        self.line(f"{last} = false;")
        self.indent -= 1
        # Split 0 (the tile's first k blocks: its CTA's last run, so the others are done or
        # nearly): waits for their arrivals (acquire), then adds their partials in split order.
        self.line("} else {")
        self.indent += 1
        self.line("if (threadIdx.x == 0) {")
        self.line("  while (pf::load_acquire(pf_sk_count) != pf_sk_arrivals - 1u) {}")
        self.line("  *pf_sk_count = 0;  // ready for the next launch")
        self.line("}")
        self.line(sync)
        group, batch = partial_reads(
            s.registers, STREAM_K_READS_IN_FLIGHT * 4 // (2 if s.registers > 96 else 1),
            s.splits - 1)
        self._partials_added(
            s, "unsigned", "1", "pf_sk_arrivals", part, offsets, lambda n: min(group, n), batch,
            (4, lambda sl, acc, off: f"pf::load_cg_f32x4(pf_sk_p + {at(off, '(pf_g + pf_j)')}, "
                                     "pf_v[pf_j], pf_v[pf_j + 1], pf_v[pf_j + 2], pf_v[pf_j + 3]);"),
            (1, lambda sl, acc: f"{acc.name}[pf_g + pf_j] += pf_v[pf_j];"))
        self.indent -= 1
        self.line("}")
        self.indent -= 1
        self.line("}")

    @staticmethod
    def _partials_sync(s) -> str:
        """The barrier of a SplitKReduce's warp group: its named barrier, or the block's."""
        return ("__syncthreads();" if s.barrier is None else
                f"pf::named_barrier_sync({s.barrier[0]}, {s.barrier[1]});")

    def _partials_added(self, s, index_type: str, first: str, end: str, part: int, offsets,
                        group_of, batch: int, load, add) -> None:
        """The loop over partials pf_s = `first` .. `end` - 1 (each at pf_sk_all + pf_s * part)
        that adds them to the accumulators `s.accs` (their first registers at `offsets` within
        a partial), `batch` partials at a time: for each group of group_of(registers) floats,
        the reads of the batch's partials are all issued before their adds, which run in split
        order (the sums' bits do not depend on the batch). `load` = (registers per read, its
        statement for slice sl, accumulator acc and offset off, reading pf_sk_p into pf_v),
        `add` = (registers per add, its statement adding pf_v)."""
        (load_step, load_stmt), (add_step, add_stmt) = load, add
        self.line("#pragma unroll 1")
        self.line(f"for ({index_type} pf_s = {first}; pf_s < {end}; pf_s += {batch}) {{")
        for sl, (acc, off) in enumerate(zip(s.accs, offsets)):
            n = acc.size.value
            group = group_of(n)
            self.line("  #pragma unroll")
            self.line(f"  for (int pf_g = 0; pf_g < {n}; pf_g += {group}) {{")
            self.line(f"    float pf_vs[{batch}][{group}];")
            for step, stmt, what in ((load_step, load_stmt(sl, acc, off), "reads"),
                                     (add_step, add_stmt(sl, acc), "adds")):
                self.line(f"    #pragma unroll  // the batch's {what}")
                self.line(f"    for (int pf_b = 0; pf_b < {batch}; ++pf_b) {{")
                guard = "" if batch == 1 else f"if (pf_s + pf_b >= {end}) break; "
                self.line(f"      {guard}const float* const pf_sk_p = pf_sk_all + (pf_s + pf_b) "
                          f"* {part}; float* const pf_v = pf_vs[pf_b]; (void)pf_sk_p;")
                self.line("      #pragma unroll")
                self.line(f"      for (int pf_j = 0; pf_j < {group}; pf_j += {step})")
                self.line(f"        {stmt}")
                self.line("    }")
            self.line("  }")
        self.line("}")

    def _StSharedPair(self, s):
        if s.dst.buffer.dtype.size != 4 or len(s.values) != 2:
            raise ValueError(f"a shared pair of {len(s.values)} {s.dst.buffer.dtype} values is "
                             "not printed")
        t = ctype(s.dst.buffer.dtype)
        a, b = (self.value(v, t) for v in s.values)
        self.line(f"{{ alignas(8) const {t} pf_pair[2] = {{{a}, {b}}}; "
                  f"pf::store_shared<8>(&{self.expr(s.dst)}, pf_pair); }}")

    def _RegisterCopy(self, s):
        self.line(f"{self.expr(s.dst)} = {self.value(s.src, ctype(s.dst.buffer.dtype))};")

    def _StMatrix(self, s):
        pack = {DataType.BFloat16: "pf::pack_bf16x2", DataType.Half: "pf::pack_half2"}.get(s.dtype)
        if pack is None or len(s.values) != 8:
            raise ValueError(f"stmatrix of {s.dtype} with {len(s.values)} values is not printed")
        regs = ", ".join(f"{pack}({self.value(s.values[2 * k], 'float')}, "
                         f"{self.value(s.values[2 * k + 1], 'float')})" for k in range(4))
        self.line(f"pf::stmatrix_x4(pf::smem_addr(&{self.expr(s.dst)}), {regs});")

    def _LdMatrix(self, s):
        from_bits = {DataType.BFloat16: "pf::bf16_from_bits",
                     DataType.Half: "pf::half_from_bits"}.get(s.out.dtype)
        if from_bits is None or s.src.buffer.dtype != s.out.dtype:
            raise ValueError(f"ldmatrix of {s.src.buffer.dtype} into {s.out.dtype} is not printed")
        self.line("{")
        self.indent += 1
        self.line("unsigned pf_ldm[4];")
        self.line(f"pf::ldmatrix_x4(pf::smem_addr(&{self.expr(s.src)}), pf_ldm[0], pf_ldm[1], "
                  "pf_ldm[2], pf_ldm[3]);")
        for k in range(4):
            self.line(f"{s.out.name}[{2 * k}] = {from_bits}(pf_ldm[{k}] & 0xffffu);")
            self.line(f"{s.out.name}[{2 * k + 1}] = {from_bits}(pf_ldm[{k}] >> 16);")
        self.indent -= 1
        self.line("}")

    def _TensorMapStore(self, s):
        coords = ", ".join(f"(int)({self.expr(c)})" for c in s.coords)
        self.guarded(s.predicate, [f"pf::tma_store_{len(s.coords)}d(&{s.tmap.name}, {coords}, "
                                   f"pf::smem_addr(&{self.expr(s.src)}));"])

    def _BulkCommit(self, s):
        self.line("pf::bulk_commit_group();")

    def _BulkWait(self, s):
        self.line(f"pf::bulk_wait_group{'_read' if s.read else ''}<{s.pending}>();")

    def _FenceProxyAsync(self, s):
        self.line("pf::fence_proxy_async_shared();")

    def _SetMaxNReg(self, s):
        self.line(f"pf::setmaxnreg_{'inc' if s.increase else 'dec'}<{s.count}>();")

    def _BlockSync(self, s):
        if s.barrier_id is None:
            self.line("__syncthreads();")
        else:
            self.line(f"pf::named_barrier_sync({s.barrier_id}, {self.expr(s.count)});")

    def _GridSync(self, s):
        sync = "" if s.barrier is None else f", pf::NamedBarrier{{{s.barrier[0]}, {s.barrier[1]}}}"
        self.line(f"pf::grid_sync(reinterpret_cast<unsigned*>({s.sync_buffer.name}){sync});")

    def _GridReduce(self, s):
        """Last-block grid reduction over the block dims in s.dims (see lower/reductions.py).
        Siblings grouped into it (lower/grouped_reductions.py) share its workspace, each
        sibling's partials in a plane of their own laid out as a single value's (a slot's row
        mixing the siblings' values ran 5-14% slower on column sums, H200)."""
        count = K.reduced_values(s)
        t = ctype(s.dtype)
        red_t = set(s.thread_dims)
        keep_t = [d for d in "xyz" if d not in red_t]
        red_b = set(s.dims)
        keep_b = [d for d in "xyz" if d not in red_b]
        tdim = {"x": "blockDim.x", "y": "blockDim.y", "z": "blockDim.z"}
        gdim = {"x": "gridDim.x", "y": "gridDim.y", "z": "gridDim.z"}
        tid = {"x": "pf_tidx", "y": "pf_tidy", "z": "pf_tidz"}
        bid = {"x": "pf_bidx", "y": "pf_bidy", "z": "pf_bidz"}

        def linear(dims, idx, ext):
            out = "0"
            for d in reversed(dims):
                out = f"({out} * (index_t){ext[d]} + {idx[d]})"
            return out
        nslots = "*".join(f"(index_t){tdim[d]}" for d in keep_t) or "1"
        slot = linear(keep_t, tid, tdim)
        kept_block = linear(keep_b, bid, gdim)
        n_kept_blocks = "*".join(f"(index_t){gdim[d]}" for d in keep_b) or "1"
        red_block = linear(sorted(red_b), bid, gdim)
        n_red = "*".join(f"(index_t){gdim[d]}" for d in sorted(red_b)) or "1"
        writer = " && ".join(f"{tid[d]} == 0" for d in sorted(red_t)) or "true"
        ws, sem = s.workspace.name, s.sync_buffer.name
        op = REDUCE[s.op]
        self.line("{  // grid reduction over blockIdx." + ",".join(sorted(red_b)))
        self.indent += 1
        self.line(f"const index_t pf_slot = {slot}, pf_nslots = {nslots};")
        self.line(f"const index_t pf_kept = {kept_block}, pf_nkept = {n_kept_blocks}, pf_nred = {n_red};")
        if len(s.values) > 1:
            # Each sibling's partials in a plane of their own, laid out as one value's are:
            # a slot's row of a plane holds that sibling's values only.
            self.line("const index_t pf_plane = pf_nred * pf_nkept * pf_nslots;")
        self.line(f"if ({writer}) {{")
        for v, at in zip(s.values, _offsets(s.values)):
            self.line(f"  for (int pf_k = 0; pf_k < {v.vector}; ++pf_k) {ws}[{_plane(at)}((({red_block}) * pf_nkept + pf_kept) * pf_nslots + pf_slot) * {v.vector} + pf_k] = {v.buffer.name}[{self.expr(v.index)} + pf_k];")
        self.line("}")
        # The partials reach the last block through the chain grid_sync.cuh describes: the
        # barrier orders every writer before the leader, whose arrival releases them at GPU
        # scope; the last leader's arrival (or wait) acquires every block's, and the barrier
        # after it orders that before its block's reads. No fence in every thread.
        self.line("__syncthreads();")
        if s.follows_last_block:
            # The block that was last for the kernel's first grid reduction over these dims
            # combines this one too: it waits for every block's arrival (all of them are
            # running or done: they reached the first one; lower/reductions.py).
            self.line("if (pf_tidx == 0 && pf_tidy == 0 && pf_tidz == 0) {")
            self.line(f"  pf::grid_arrive(reinterpret_cast<unsigned*>(&{sem}[pf_kept]));")
            self.line("  if (pf_grid_last) {")
            self.line(f"    while (pf::load_acquire(reinterpret_cast<unsigned*>(&{sem}[pf_kept])) < (unsigned)pf_nred) {{}}")
            self.line(f"    {sem}[pf_kept] = 0;  // ready for the next launch")
            self.line("  }")
            self.line("}")
            self.line("__syncthreads();")
        else:
            self.line("__shared__ int pf_is_last;")
            self.line("if (pf_tidx == 0 && pf_tidy == 0 && pf_tidz == 0) {")
            self.line(f"  const unsigned pf_prev = pf::grid_arrive(reinterpret_cast<unsigned*>(&{sem}[pf_kept]));")
            self.line("  pf_is_last = (pf_prev == (unsigned)(pf_nred - 1));")
            self.line(f"  if (pf_is_last) {sem}[pf_kept] = 0;  // ready for the next launch")
            self.line("}")
            self.line("__syncthreads();")
            self.line("pf_grid_last = pf_is_last;")
        # The last block combines the partials with all its threads: the threads of one slot
        # (equal kept thread coords) split the partials by a fixed stride, each combining its
        # own in block order, then a block all-reduce over the reduced thread dims (the same
        # fixed tree as the block step before it). The order is a function of the launch only:
        # the result is the same bits at every run, and every thread of the block holds it.
        red_t_dims = sorted(red_t)
        rlin = linear(red_t_dims, tid, tdim)
        nrt = "*".join(f"(index_t){tdim[d]}" for d in red_t_dims) or "1"
        vol = f"reinterpret_cast<volatile {t}*>({ws})"
        self.line("if (pf_grid_last) {")
        self.indent += 1
        self.line(f"const index_t pf_rt = {rlin}, pf_nrt = {nrt};")
        # The partial rows outer and the `count` values of a row inner: each row's values are
        # adjacent and their loads independent, so a thread has `count` loads (times the
        # unrolled rows) in flight, not one: with many blocks per kept coordinate (a
        # reduction split over hundreds of blocks) the serial loop over rows, one L2 round
        # trip per value, was the kernel's tail. Each value still combines its rows in the
        # same order (the same bits).
        self.line(f"{t} pf_a[{count}];")
        self.line("#pragma unroll")
        self.line(f"for (int pf_k = 0; pf_k < {count}; ++pf_k) pf_a[pf_k] = pf::identity<{REDUCE_OP[s.op][:-2]}, {t}>();")
        self.line("#pragma unroll 4")
        self.line("for (index_t pf_r = pf_rt; pf_r < pf_nred; pf_r += pf_nrt) {")
        for j, (v, at) in enumerate(zip(s.values, _offsets(s.values))):
            row = "pf_row" if len(s.values) == 1 else f"pf_row{j}"
            self.line(f"  const index_t {row} = {_plane(at)}((pf_r * pf_nkept + pf_kept) * pf_nslots + pf_slot) * {v.vector};")
            self.line("  #pragma unroll")
            self.line(f"  for (int pf_k = 0; pf_k < {v.vector}; ++pf_k) {{")
            self.line(f"    const {t} pf_b = {vol}[{row} + pf_k];")
            acc = f"pf_a[{_plus(at)}pf_k]"
            self.line(f"    {acc} = {op.format(a=acc, b='pf_b')};")
            self.line("  }")
        self.line("}")
        for v, at in zip(s.values, _offsets(s.values)):
            self.line("#pragma unroll")
            self.line(f"for (int pf_k = 0; pf_k < {v.vector}; ++pf_k) {v.buffer.name}[{self.expr(v.index)} + pf_k] = pf_a[{_plus(at)}pf_k];")
        self._grouped_allreduce(s, red_t_dims)
        self.indent -= 1
        self.line("}")
        self.indent -= 1
        self.line("}")


# Reads of split-K partials a thread issues before adding them: their registers come on top of
# the accumulators within the kernel's launch-bound register count (8 spilled 16 bytes in a
# ping-pong kernel of 128 accumulators).
SPLIT_K_READS_IN_FLIGHT = 4
# Stream-K's 16-byte partial reads a thread issues before adding them, halved above 96
# accumulators (128x256 tiles with a bias's 64 column registers spilled 96 bytes with 8, NVRTC
# 13.0; the tests check ptxas's report).
STREAM_K_READS_IN_FLIGHT = 8
# A tile's fixup is a chain of round trips to L2, each carrying the partial values a thread
# has in flight: with 32 floats of one partial per trip, a 128x64 tile spread over 15 CTAs
# took 14 trips. Partial values a thread reads before adding them: up to
# PARTIAL_READS_FLOATS, within PARTIAL_READ_REGISTERS beside its accumulators (more spilled:
# 96 in flight beside 32 accumulators, NVRTC 13.0; the tests check ptxas's report).
PARTIAL_READ_REGISTERS = 128
PARTIAL_READS_FLOATS = 64
# Split-K's reads are 8 bytes, each under its row's predicate: 64 floats beside 64
# accumulators spilled 12 bytes, 32 beside 96 (a 128x192 tile) 16 bytes.
SPLIT_K_READS_FLOATS = 32
SPLIT_K_READ_REGISTERS = 96


def partial_reads(registers: int, group: int, partials: int, most: int = PARTIAL_READS_FLOATS,
                  budget: int = PARTIAL_READ_REGISTERS) -> tuple[int, int]:
    """(floats of a group, partials per batch) of a fixup's reads beside `registers`
    accumulators: at least `group` floats of one partial (the default), more up to `most`
    within `budget` registers (a power of two dividing `registers`, a whole partial, then
    several partials, at most the `partials` there can be)."""
    floats = min(most, budget - registers)
    if floats >= registers:
        return registers, max(1, min(partials, floats // registers))
    while group * 2 <= floats and registers % (group * 2) == 0:
        group *= 2
    return min(group, registers), 1


def _offsets(values) -> list:
    """Where each of a grouped step's values starts among all of them."""
    out, at = [], 0
    for v in values:
        out.append(at)
        at += v.vector
    return out


def _plane(at: int) -> str:
    """`pf_plane * at + ` in front of a grid workspace index: the plane of the grouped step's
    sibling whose values start at `at`; nothing for the first."""
    return f"pf_plane * {at} + " if at else ""


def _plus(at: int) -> str:
    """`at + ` in front of an index, nothing for 0 (a single value's code stays as it was)."""
    return f"{at} + " if at else ""


def _compute_ctype(dt: DataType) -> str:
    return CTYPE[compute_type(dt)]


def unary_ctype(e: UnaryOp) -> str:
    """The C type a unary op's operand is read in: a cast reads its source's compute type (and
    pf::cast converts once); other ops compute in their output's (exp of an int64 is float)."""
    if e.op in (UnaryOpType.Cast, UnaryOpType.Set):
        return _compute_ctype(e.inputs[0].dtype)
    if e.op == UnaryOpType.LseKey:          # a float32 element to its int64 key
        return "float"
    if e.op in (UnaryOpType.LseMax, UnaryOpType.LseSum):   # an int64 key to a float32
        return "long long"
    return _compute_ctype(e.outputs[0].dtype)


def binary_ctypes(e: BinaryOp) -> tuple[str, str]:
    """The C types a binary op's operands are read in: the compute type of its operand dtype
    (BinaryOp.operand_dtype: bool for logical ops, torch's result type for comparisons, the
    output's dtype for arithmetic, the value's for an arg key), and for an arg key's index an
    int64."""
    ct = _compute_ctype(e.operand_dtype)
    return ct, ("long long" if e.op.is_arg_key else ct)


# The 16- and 8-bit float types: structs without C++ conversions (types.cuh), reached with
# pf::cast.
REDUCED_FLOAT_CTYPES = ("pf::half", "pf::bf16", "pf::fp8e4m3", "pf::fp8e5m2")


def convert(text: str, want: str, src: str | None = None) -> str:
    """The C expression `text` (of C type `src` where known) converted to C type `want`:
    pf::cast into or out of a 16- or 8-bit float (it rounds through float to nearest even, as
    torch converts; the structs have no C++ conversions), static_cast otherwise, nothing if `src` is
    `want`."""
    if src == want:
        return text
    if want in REDUCED_FLOAT_CTYPES or src in REDUCED_FLOAT_CTYPES:
        return f"pf::cast<{want}>({text})"
    return f"static_cast<{want}>({text})"


def _is_input(kernel, buf) -> bool:
    return buf.tv is not None and buf.tv in kernel.fusion.inputs


def literal(v, want: str) -> str:
    """A Python number as a C expression of type `want`."""
    if want in REDUCED_FLOAT_CTYPES:
        # Converted as torch converts a Python number to a 16-bit tensor: through float
        # (c10::Half(float)), so a double is rounded twice, by pf::cast's one rule.
        if isinstance(v, bool) or isinstance(v, float):
            return convert(literal(v, "bool" if isinstance(v, bool) else "double"), want)
        return convert(f"{int(v)}LL", want)
    if want == "bool":
        return "true" if v else "false"
    if isinstance(v, bool):
        # A number, not `true`: pf::pow(float, bool) would match no overload better than another.
        v = int(v)
    if want in ("float", "double"):
        f = float(v)
        if want == "float":
            # Rounded here to float, as torch converts a Python number for a float32 op: NVRTC
            # would round alike, but a literal it rounds to inf (3e38 < |f|) or to 0 (|f| <
            # 1e-46) is an error ("floating constant is out of range").
            with np.errstate(over="ignore", under="ignore"):
                f = float(np.float32(f))
        if math.isnan(f):
            return f"pf::quiet_nan<{want}>()"
        if math.isinf(f):
            return f"{'-' if f < 0 else ''}pf::infinity<{want}>()"
        text = repr(f)
        return text + ("f" if want == "float" else "")
    if isinstance(v, float):
        return f"static_cast<{want}>({literal(v, 'double')})"
    if int(v) == -2 ** 63:
        # 9223372036854775808LL does not fit a long long: its negation would be unsigned.
        return f"static_cast<{want}>(-9223372036854775807LL - 1)"
    return f"static_cast<{want}>({int(v)}LL)"


# Widening of a recomputed 16-bit value, hidden from common subexpression elimination so that a
# projected persistent buffer stays 16-bit in registers (see schedule/recompute.py).
_OPAQUE_WIDEN = r"""
__device__ __forceinline__ float pf_opaque_widen(pf::bf16 v) {
  unsigned r;
  asm volatile("shl.b32 %0, %1, 16;" : "=r"(r) : "r"((unsigned)v.bits));
  return __uint_as_float(r);
}
__device__ __forceinline__ float pf_opaque_widen(pf::half v) {
  float r;
  asm volatile("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(v.bits));
  return r;
}
"""


_SMEM_BASE = "pf_smem_aligned"
_WGMMA_TYPES = {DataType.BFloat16: "bf16", DataType.Half: "f16"}


def _wgmma_name(n: int, dtype: DataType, trans_a: bool = False, trans_b: bool = False) -> str:
    return (f"pf_wgmma_m64n{n}k16_{_WGMMA_TYPES[dtype]}{'_ta' if trans_a else ''}"
            f"{'_tb' if trans_b else ''}")


def wgmma_helper(n: int, dtype: DataType, trans_a: bool = False, trans_b: bool = False) -> str:
    """The device function issuing wgmma.mma_async m64n{n}k16 (f32 += {dtype} x {dtype}, both
    operands from shared memory, K-major, or with `trans_a` / `trans_b` MN-major): one "+f"
    operand per accumulator register, which the device library cannot spell for every n.
    scale_d 0 gives D = A * B."""
    if dtype not in _WGMMA_TYPES or n % 8 or not 8 <= n <= 256:
        raise ValueError(f"wgmma m64n{n}k16 of {dtype} does not exist")
    regs = n // 2
    t = _WGMMA_TYPES[dtype]
    dlist = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    return (f"__device__ __forceinline__ void {_wgmma_name(n, dtype, trans_a, trans_b)}"
            f"(float (&d)[{regs}], "
            "unsigned long long desc_a, unsigned long long desc_b, int scale_d) {\n"
            "  asm volatile(\n"
            f'      "{{\\n .reg .pred p;\\n setp.ne.b32 p, %{regs + 2}, 0;\\n"\n'
            f'      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} "\n'
            f'      "{{{dlist}}}, %{regs}, %{regs + 1}, p, 1, 1, {int(trans_a)}, {int(trans_b)};\\n}}\\n"\n'
            f"      : {outs}\n"
            '      : "l"(desc_a), "l"(desc_b), "r"(scale_d));\n'
            "}\n")


def _param_decl(p: K.Param, kernel: K.Kernel) -> str:
    if p.kind == "ptr":
        t = ctype(p.buffer.dtype)
        const = "const " if p.source[0] == "input" else ""
        return f"{const}{t}* __restrict__ {p.name}"
    if p.kind == "tmap":
        return f"const __grid_constant__ pf::CUtensorMap {p.name}"
    return f"{PARAM_CTYPE[p.kind]} {p.name}"


def generate_cuda(kernel: K.Kernel) -> str:
    """Full CUDA source: device library, then the kernel. Only prints: every size and offset
    (shared memory included) was decided by lowering."""
    smem_bytes = kernel.launch.shared_mem_dynamic
    pr = CudaPrinter(kernel)
    pr.stmts(kernel.body)
    body = pr.lines
    lb = kernel.launch.max_threads
    bounds = ""
    if lb:
        bounds = f"__launch_bounds__({lb}{', ' + str(kernel.launch.min_blocks) if kernel.launch.min_blocks else ''}) "
    params = ",\n    ".join(_param_decl(p, kernel) for p in kernel.params)
    head = [
        "// Generated by pyfuser. Fusion:",
        *("// " + line for line in repr(kernel.fusion).splitlines()[:60]),
        f"typedef {'int' if kernel.index_type == 'int' else 'long long'} index_t;",
        "",
        f'extern "C" __global__ void {bounds}{kernel.name}(',
        f"    {params}) {{",
        "  const index_t pf_tidx = threadIdx.x, pf_tidy = threadIdx.y, pf_tidz = threadIdx.z;",
        "  const index_t pf_bidx = blockIdx.x, pf_bidy = blockIdx.y, pf_bidz = blockIdx.z;",
        "  const index_t pf_bdimx = blockDim.x, pf_gdimx = gridDim.x;",
        "  (void)pf_tidx; (void)pf_tidy; (void)pf_tidz; (void)pf_bidx; (void)pf_bidy; (void)pf_bidz;",
        "  (void)pf_bdimx; (void)pf_gdimx;",
    ]
    if any(isinstance(x, K.GridReduce) for x in K.walk(kernel.body)):
        head.append("  bool pf_grid_last = false;")
    if smem_bytes:
        head.append("  extern __shared__ __align__(128) unsigned char pf_smem[];")
        if kernel.smem_align > 128:
            # The array's base is only 128-byte aligned; the layout assumed smem_align.
            a = kernel.smem_align
            head.append(f"  unsigned char* const {_SMEM_BASE} = pf_smem + (({a}u - "
                        f"(pf::smem_addr(pf_smem) & {a - 1}u)) & {a - 1}u);")
    ws_elems = kernel.reduction_workspace
    for t in sorted(pr.ws_types):
        head.append(f"  __shared__ __align__(16) {t} pf_red_ws_{t.replace(' ', '_')}[{ws_elems}];")
    if pr.cluster_types:
        cluster = kernel.launch.cluster
        size = cluster[0] * cluster[1] * cluster[2]
        for t in sorted(pr.cluster_types):
            head.append(f"  __shared__ __align__(16) {t} pf_cluster_slots_{t.replace(' ', '_')}"
                        f"[{2 * pr.rows() * size}];")
        # Every CTA of the cluster running before any remote store (cluster_reduce.cuh).
        head += ["  unsigned pf_cluster_phase = 0;", "  pf::cluster_sync();"]
    helpers = "".join(wgmma_helper(n, dt, ta, tb) for n, dt, ta, tb in sorted(
        pr.wgmma_shapes, key=lambda x: (x[0], x[1].name, x[2], x[3])))
    src = (device_library_source() + "\n" + _OPAQUE_WIDEN + helpers + "\n".join(head + body)
           + "\n}\n")
    return src
