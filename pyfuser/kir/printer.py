"""Readable text of a Kernel (PYFUSER_DUMP=kernel_ir): CUDA-like, with loop kinds spelled out."""
from __future__ import annotations

from . import nodes as K
from .rewrite import stmt_roles


def _e(x) -> str:
    if isinstance(x, K.TensorOp):
        return ""
    return repr(x)


def _op(s: K.TensorOp) -> str:
    e = s.expr
    name = getattr(getattr(e, "op", None), "value", type(e).__name__)
    ins = ", ".join(repr(i) for i in s.ins)
    acc = " (accumulate)" if s.accumulate else ""
    if s.carry is not None:
        name = f"{e.op}_scan" + ("_fixup" if s.scan_fixup else "")
        acc = f" (carry {s.carry!r})"
    vec = f" vector {s.vector}" if s.vector > 1 else ""
    return f"{s.out!r} = {name}({ins}){acc}{vec}"


def kernel_str(kernel: K.Kernel) -> str:
    lines = [f"kernel {kernel.name}(" + ", ".join(p.name for p in kernel.params) + ")"]
    if kernel.launch is not None:
        lines.append(f"  launch grid={kernel.launch.grid} block={kernel.launch.block}"
                     f" cooperative={kernel.launch.cooperative} cluster={kernel.launch.cluster}")

    def emit(body, depth):
        pad = "  " * depth
        for s in body:
            if isinstance(s, K.ForLoop):
                label = f"  // {s.label}" if s.label else ""
                unroll = " unroll" if s.unroll else ""
                lines.append(f"{pad}for {s.var!r} in {s.parallel}[{s.start!r}, {s.stop!r}){unroll}:{label}")
                emit(s.body, depth + 1)
            elif isinstance(s, K.IfThenElse):
                lines.append(f"{pad}if {s.cond!r}:")
                emit(s.then_body, depth + 1)
                if s.else_body:
                    lines.append(f"{pad}else:")
                    emit(s.else_body, depth + 1)
            elif isinstance(s, K.CheckedQuotients):
                lines.append(f"{pad}checked quotients {s.flag}:")
                emit(s.fast, depth + 1)
                lines.append(f"{pad}if not {s.flag}:")
                emit(s.exact, depth + 1)
            elif isinstance(s, K.TensorOp):
                flag = f" [clears {s.quotient_flag}]" if s.quotient_flag else ""
                lines.append(f"{pad}{_guard(s)}{_op(s)}{flag}")
            elif isinstance(s, K.Allocate):
                b = s.buffer
                lines.append(f"{pad}alloc {b.memory} {b.dtype.ir_name} {b.name}[{b.size!r}]")
            elif isinstance(s, K.InitValue):
                lines.append(f"{pad}{s.out.name}[*] = {s.value!r}")
            elif isinstance(s, K.BlockReduce):
                lines.append(f"{pad}block_allreduce<{','.join(s.dims)}>({s.op}, {s.values})")
            elif isinstance(s, K.BlockScan):
                cl = f" cluster {s.cluster}" if s.cluster else ""
                if s.chain:
                    cl += f" chained through {s.chain[0].name}, {s.chain[1].name}"
                lines.append(f"{pad}block_exclusive_scan<x>({s.op}, {s.carry!r}){cl}")
            elif isinstance(s, K.BlockTopK):
                order = "largest" if s.largest else "smallest"
                lines.append(f"{pad}block_topk<x>({s.k} {order} of {s.chunk.name}[{s.chunk_size}] "
                             f"row {s.extent!r} -> {s.values.name}, {s.indices.name} by "
                             f"{s.stride}; {s.workspace.name})")
            elif isinstance(s, K.GridReduce):
                lines.append(f"{pad}grid_reduce<{','.join(s.dims)}>({s.op}, {s.values})")
            elif isinstance(s, K.BlockSync):
                lines.append(f"{pad}block_sync" + (f"({s.barrier_id})" if s.barrier_id else ""))
            elif isinstance(s, K.BulkLoad):
                lines.append(f"{pad}{_guard(s)}bulk_load {s.dst!r} <- {s.src!r} ({s.bytes!r} bytes, "
                             f"on {s.bar!r})")
            elif isinstance(s, K.TensorMapLoad):
                coords = ", ".join(map(repr, s.coords))
                cast = f", multicast to {s.multicast} CTAs" if s.multicast > 1 else ""
                lines.append(f"{pad}{_guard(s)}tensor_map_load {s.dst!r} <- {s.tmap!r}[{coords}] "
                             f"{_box(s.map)} ({s.bytes!r} bytes, on {s.bar!r}{cast})")
            elif isinstance(s, K.TensorMapStore):
                coords = ", ".join(map(repr, s.coords))
                lines.append(f"{pad}{_guard(s)}tensor_map_store {s.tmap!r}[{coords}] <- {s.src!r} "
                             f"{_box(s.map)}")
            elif isinstance(s, K.Wgmma):
                r = s.n // 2
                lines.append(f"{pad}wgmma.m64n{s.n}k16.{s.dtype.ir_name} {s.acc.name}[{r}] = "
                             f"{s.a!r} @ {s.b!r}^T + ({s.scale_d!r} ? {s.acc.name} : 0) "
                             f"(swizzle {s.swizzle})")
            elif isinstance(s, K.StMatrix):
                vals = ", ".join(map(repr, s.values))
                lines.append(f"{pad}stmatrix.x4.{s.dtype.ir_name} {s.dst!r} <- ({vals})")
            elif type(s) in _FIXED:
                lines.append(f"{pad}{_FIXED[type(s)]}")
            elif isinstance(s, K.BulkWait):
                lines.append(f"{pad}bulk_wait_group{'.read' if s.read else ''} {s.pending}")
            elif isinstance(s, K.WgmmaWait):
                lines.append(f"{pad}wgmma.wait_group {s.pending}")
            elif isinstance(s, K.AccumulatorFence):
                lines.append(f"{pad}accumulator_fence {s.acc.name}")
            elif isinstance(s, K.CpAsyncCopy):
                lines.append(f"{pad}{_guard(s)}cp_async {s.dst!r} <- {s.src!r} ({s.bytes} bytes)")
            elif isinstance(s, K.CpAsyncCommit):
                lines.append(f"{pad}cp_async_commit_group")
            elif isinstance(s, K.CpAsyncWait):
                lines.append(f"{pad}cp_async_wait_group {s.pending}")
            elif isinstance(s, K.ScalarDef):
                lines.append(f"{pad}{s.var!r} = {s.value!r}")
            elif isinstance(s, K.RoleSplit):
                lines.append(f"{pad}warp roles:")
                emit(s.roles, depth + 1)
            elif isinstance(s, K.RoleBody):
                r = s.role
                bar = f", named barrier {r.barrier}" if r.barrier else ""
                when = f" if {s.cond!r}" if s.cond is not None else " (the rest)"
                lines.append(f"{pad}role {r.name} ({r.registers} registers{bar}){when}:")
                emit(s.body, depth + 1)
            elif isinstance(s, (K.Comment, K.Raw)):
                lines.append(f"{pad}{type(s).__name__} {s.text}")
            else:
                # Any other kind: its fields, as its declared roles name them (an undeclared
                # kind is an error, not a blank line).
                table = stmt_roles(s)
                args = ", ".join(f"{f}={getattr(s, f)!r}" for f, role in table.items()
                                 if role != K.BODY and (role != K.DATA or _plain(getattr(s, f))))
                lines.append(f"{pad}{type(s).__name__}({args})")
                for f, role in table.items():
                    if role == K.BODY:
                        emit(getattr(s, f), depth + 1)

    emit(kernel.body, 1)
    return "\n".join(lines)


# Statements without operands, printed as their PTX.
_FIXED = {K.BulkCommit: "bulk_commit_group", K.ClusterSync: "cluster_sync",
          K.FenceProxyAsync: "fence.proxy.async.shared::cta",
          K.WgmmaFence: "wgmma.fence", K.WgmmaCommit: "wgmma.commit_group"}


def _box(m) -> str:
    """A tensor map's box: a RowBoxMap's 3D box, a TileBoxMap's rows of its tensor."""
    if isinstance(m, K.TileBoxMap):
        return (f"tile of {m.role} {m.index} (rows along dim {m.outer}, columns along dim "
                f"{m.inner}) box {m.box_rows}x{m.box_cols} swizzle {m.swizzle}")
    return f"box {m.box}"


def _plain(v) -> bool:
    """A data field worth printing: numbers, strings, flags, kernel buffers and tuples of them
    (not fusion objects)."""
    if isinstance(v, (tuple, list)):
        return all(_plain(x) for x in v)
    return v is None or isinstance(v, (bool, int, float, str, K.MBarriers, K.Buffer))


def _guard(s) -> str:
    """`if <predicate>: ` before a guarded statement, nothing when it always runs."""
    return "" if K.is_true(s.predicate) else f"if {s.predicate!r}: "
