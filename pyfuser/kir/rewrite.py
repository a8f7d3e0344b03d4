"""Visiting and rewriting kernel IR through the declared field roles of its nodes.

Every node kind declares the role of each of its fields (kir/nodes.py `roles`): nested
statement lists, the variable a statement defines, the expressions it uses, the buffers it
touches, and data that is never rewritten. The helpers here go through those roles, so a pass
that rewrites operands (a circular buffer's slot offset, a loop index substituted) reaches every
operand of every node kind, including kinds added after the pass was written, and a node kind
that declares no roles is an error, not a silent pass-through.

- `Rewriter`: rebuilds a statement list. A pass overrides `visit_<Kind>` for the statement kinds
  it changes (returning a statement or a list of statements) and the expression hooks
  (`var`, `special`, `tensor_index`, `buffer`) for the operands it changes; everything else is
  rebuilt through the roles, copied only where something inside changed.
- `Substitution`: the Rewriter that replaces variables (`substitute(e, mapping)` for one
  expression, `substitute_stmts(body, mapping)` for statements).
- `walk`, `exprs_of`, `subexprs`, `buffers_of`: read-only visits.
"""
from __future__ import annotations

import dataclasses

from . import nodes as K

__all__ = ["Rewriter", "Substitution", "UnknownNodeKind", "accesses", "buffers_of", "exprs_of",
           "fresh_stmts", "replace_stmt", "subexprs", "substitute", "substitute_stmts",
           "vars_defined", "vars_in", "vars_read", "walk"]


class UnknownNodeKind(TypeError):
    """A statement or expression whose class declares no field roles (kir/nodes.py `roles`)."""


def stmt_roles(s) -> dict:
    table = K.STMT_KINDS.get(type(s))
    if table is None:
        raise UnknownNodeKind(f"{type(s).__name__} is not a kernel-IR statement kind (declare "
                              "its fields with kir.nodes.roles)")
    return table


def expr_roles(e) -> dict:
    table = K.EXPR_KINDS.get(type(e))
    if table is None:
        raise UnknownNodeKind(f"{type(e).__name__} is not a kernel-IR expression kind (declare "
                              "its fields with kir.nodes.roles)")
    return table


# Read-only visits ---------------------------------------------------------------------------------
walk = K.walk


def _expr_values(x):
    """The kernel expressions in a field value of role EXPR or EXPRS (fusion Vals, None and
    other non-expressions skipped)."""
    if isinstance(x, K.KExpr):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _expr_values(y)


def exprs_of(s) -> list:
    """(field, expression) for each kernel expression statement `s` uses or writes (its own
    fields, not nested bodies; a defined variable is not a use)."""
    out = []
    for f, role in stmt_roles(s).items():
        if role in (K.OUT, K.EXPR, K.EXPRS):
            out += [(f, e) for e in _expr_values(getattr(s, f))]
    return out


def accesses(s) -> tuple[list, list]:
    """(TensorIndex reads, TensorIndex writes) of statement `s` itself (not nested bodies):
    the accesses of its OUT fields are writes; every other access, the indices of written
    accesses included, is a read."""
    reads, writes = [], []
    for f, role in stmt_roles(s).items():
        if role not in (K.OUT, K.EXPR, K.EXPRS):
            continue
        for e in _expr_values(getattr(s, f)):
            if role == K.OUT and isinstance(e, K.TensorIndex):
                writes.append(e)
                e = e.index
            reads += [x for x in subexprs(e) if isinstance(x, K.TensorIndex)]
    return reads, writes


def subexprs(e):
    """`e` and every expression inside it, parents first."""
    if not isinstance(e, K.KExpr):
        return
    yield e
    for f, role in expr_roles(e).items():
        if role in (K.EXPR, K.EXPRS):
            for x in _expr_values(getattr(e, f)):
                yield from subexprs(x)


def vars_in(e) -> set:
    """Names of the variables expression `e` reads."""
    return {x.name for x in subexprs(e) if isinstance(x, K.Var)}


def vars_read(stmts) -> set:
    """Names of the variables `stmts` read (nested bodies included)."""
    return {name for st in K.walk(stmts) for _, e in exprs_of(st) for name in vars_in(e)}


def vars_defined(stmts) -> set:
    """Names of the variables `stmts` define (loop indices, scalar definitions; nested bodies
    included)."""
    return {getattr(st, f).name for st in K.walk(stmts)
            for f, role in stmt_roles(st).items() if role == K.DEFINES}


def buffers_of(s) -> list:
    """(field, Buffer) for each buffer statement `s` names directly (role BUFFER/BUFFERS);
    buffers inside its expressions are TensorIndex operands (see `subexprs`)."""
    out = []
    for f, role in stmt_roles(s).items():
        v = getattr(s, f)
        if role == K.BUFFER and v is not None:
            out.append((f, v))
        elif role == K.BUFFERS and v is not None:
            out += [(f, b) for b in v]
    return out


# Rewriting ----------------------------------------------------------------------------------------
_FOLD = {"+": K.add, "-": K.sub, "*": K.mul, "/": K.div, "%": K.mod, "ceilDiv": K.ceil_div,
         "<": K.lt, "==": K.eq, "&&": K.and_}


class Rewriter:
    """Rebuilds statements and expressions through their roles; subclasses override what they
    change. Nodes are copied (dataclasses.replace) only where a field changed, so an unchanged
    subtree keeps its identity; the input is never mutated."""

    # Statements -------------------------------------------------------------------------------
    def rewrite(self, body: list) -> list:
        out = []
        for s in body:
            r = self.stmt(s)
            if isinstance(r, list):
                out += r
            else:
                out.append(r)
        return out

    def stmt(self, s):
        """`s` rewritten: visit_<Kind> where the subclass defines it, else `default_stmt`.
        Returns a statement or a list of statements (spliced into the enclosing body)."""
        stmt_roles(s)
        visit = getattr(self, "visit_" + type(s).__name__, None)
        return visit(s) if visit is not None else self.default_stmt(s)

    def default_stmt(self, s):
        """`s` with its bodies rewritten, its defined variables through `define`, its
        expressions through `expr`, its buffers through `buffer`."""
        changes = {}
        for f, role in stmt_roles(s).items():
            old = getattr(s, f)
            new = self.field(role, old)
            if new is not old:
                changes[f] = new
        return dataclasses.replace(s, **changes) if changes else s

    def field(self, role: str, v):
        if role == K.BODY:
            new = self.rewrite(v)
            return v if len(new) == len(v) and all(a is b for a, b in zip(new, v)) else new
        if role == K.DEFINES:
            return self.define(v)
        if role in (K.OUT, K.EXPR):
            return self.expr(v)
        if role == K.EXPRS:
            return self.expr_seq(v)
        if role == K.BUFFER:
            return v if v is None else self.buffer(v)
        if role == K.BUFFERS:
            if v is None:
                return v
            new = type(v)(self.buffer(b) for b in v)
            return v if all(a is b for a, b in zip(new, v)) else new
        return v

    def define(self, var):
        """A variable a statement defines (not a use: `var` substitutions leave it)."""
        return var

    def buffer(self, b):
        return b

    # Expressions ------------------------------------------------------------------------------
    def expr_seq(self, v):
        if not isinstance(v, (list, tuple)):
            return self.expr(v)
        new = [self.expr_seq(x) for x in v]
        if all(a is b for a, b in zip(new, v)):
            return v
        return type(v)(new)

    def expr(self, e):
        """`e` rewritten; values that are not kernel expressions (fusion Vals before indexing,
        None, numbers) are returned as they are."""
        if not isinstance(e, K.KExpr):
            return e
        expr_roles(e)
        if isinstance(e, K.Var):
            return self.var(e)
        if isinstance(e, K.Special):
            return self.special(e)
        if isinstance(e, K.TensorIndex):
            return self.tensor_index(e)
        if isinstance(e, K.MBarrierRef):
            return self.mbarrier_ref(e)
        return self.default_expr(e)

    def default_expr(self, e):
        changes = {}
        for f, role in expr_roles(e).items():
            old = getattr(e, f)
            new = self.field(role, old)
            if new is not old:
                changes[f] = new
        if not changes:
            return e
        if isinstance(e, K.Bin):
            fold = _FOLD.get(e.op)
            a, b = changes.get("a", e.a), changes.get("b", e.b)
            return fold(a, b) if fold else K.Bin(e.op, a, b)
        return dataclasses.replace(e, **changes)

    def var(self, v: K.Var):
        return v

    def special(self, v: K.Special):
        return v

    def tensor_index(self, t: K.TensorIndex):
        return self.default_expr(t)

    def mbarrier_ref(self, b: K.MBarrierRef):
        return self.default_expr(b)


class Substitution(Rewriter):
    """Replaces the uses of variables (Var, or Special such as threadIdx.y) by expressions,
    folding constants where an operand changed."""

    def __init__(self, mapping: dict):
        self.mapping = mapping

    def var(self, v):
        return self.mapping.get(v, v)

    def special(self, v):
        return self.mapping.get(v, v)


class _FreshStatements(Rewriter):
    def default_stmt(self, s):
        changes = {f: self.rewrite(getattr(s, f)) for f, role in stmt_roles(s).items()
                   if role == K.BODY}
        return dataclasses.replace(s, **changes)


def fresh_stmts(body: list) -> list:
    """A copy of `body` with new statement nodes throughout (expressions and buffers shared):
    for statements that go to two places, a warp role each, and are changed there in place."""
    return _FreshStatements().rewrite(body)


def substitute(e, mapping: dict):
    """Expression `e` with each Var or Special in `mapping` replaced."""
    return Substitution(mapping).expr(e)


def substitute_stmts(body: list, mapping: dict) -> list:
    """Statements `body` with each use of a Var or Special in `mapping` replaced."""
    return Substitution(mapping).rewrite(body)


def replace_stmt(body: list, old, new: list) -> bool:
    """Replace statement `old` (by identity), wherever it is nested in `body`, by the
    statements `new`, in place. False when `old` is not there."""
    for k, s in enumerate(body):
        if s is old:
            body[k:k + 1] = new
            return True
        for f, role in stmt_roles(s).items():
            if role == K.BODY and replace_stmt(getattr(s, f), old, new):
                return True
    return False
