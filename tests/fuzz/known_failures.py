"""The fuzzer's CI sample (test_fuzz_sample.py): its constants, and the cases known to fail.

Each known case is a strict xfail: it must keep failing in its category, and a fixed case
turns the test red until its entry is removed. Raise SAMPLE_COUNT when the interpreter gets
faster (the sample should take about 2 minutes on one core); after changing the constants or
the generator (which changes the cases), regenerate this file:

    PYTHONPATH=$PWD python tests/fuzz/run_fuzz.py --sample --jobs 2 \
        --known-failures tests/fuzz/known_failures.py

Entries read "category: scheduler | normalized reason".
"""
SAMPLE_SEED = 20261123
SAMPLE_COUNT = 1500
SAMPLE_MAX_ELEMENTS = 32768

KNOWN = {
    # internal_error | inner_persistent | internal error in the inner_persistent scheduler's kernel 
    '20261123:207': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a ReductionOp, which is not recomputed)",
    '20261123:282': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a ReductionOp, which is not recomputed)",
    '20261123:288': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a ReductionOp, which is not recomputed)",
    '20261123:328': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a ReductionOp, which is not recomputed)",
    '20261123:536': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a ReductionOp, which is not recomputed)",
    '20261123:817': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a ReductionOp, which is not recomputed)",
    '20261123:898': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a ReductionOp, which is not recomputed)",
    '20261123:1349': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a ReductionOp, which is not recomputed)",
    '20261123:1402': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a ReductionOp, which is not recomputed)",
    '20261123:1461': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a ReductionOp, which is not recomputed)",
    # internal_error | inner_persistent | internal error in the inner_persistent scheduler's kernel 
    '20261123:267': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a FullOp, which is not recomputed)",
    '20261123:562': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a FullOp, which is not recomputed)",
    '20261123:984': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a FullOp, which is not recomputed)",
    '20261123:1202': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a FullOp, which is not recomputed)",
    # internal_error | - | execute: RuntimeError: shape '[#]' is invalid for input of size #
    '20261123:890': "internal_error: - | execute: RuntimeError: shape '[#]' is invalid for input of size #",
    '20261123:916': "internal_error: - | execute: RuntimeError: shape '[#]' is invalid for input of size #",
    # internal_error | pointwise | internal error in the pointwise scheduler's kernel (LoweringError
    '20261123:279': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (LoweringError: cannot index T#'s axis ID{i#} from its loops)",
    '20261123:1490': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (LoweringError: cannot index T#'s axis ID{i#} from its loops)",
    # definition_error | pointwise | InputError: sizes do not match at where dim #: i# = # (input # 
    '20261123:962': 'definition_error: pointwise | InputError: sizes do not match at where dim #: i# = # (input # (T#) dim #) but # = #. Operands line up from their last dim, as in torch; a dim broadcasts only where the definition says so: a dim of size # in define_tensor (shape=[..., #]), ',
    # internal_error | inner_persistent | internal error in the inner_persistent scheduler's kernel 
    '20261123:569': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (LoweringError: T# reads T#'s registers along ID{#} (TIDx) in none of its TIDx loops: the values are another thread's)",
    # internal_error | inner_persistent | internal error in the inner_persistent scheduler's kernel 
    '20261123:67': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a ReshapeOp, which is not recomputed)",
    # internal_error | pointwise | internal error in the pointwise scheduler's kernel (LoweringError
    '20261123:548': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (LoweringError: T# reads T#'s registers along ID{#} (BIDx) in none of its BIDx loops: the values are another thread's)",
    # internal_error | pointwise | internal error in the pointwise scheduler's kernel (LoweringError
    '20261123:1299': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (LoweringError: T# reads T#'s registers along ID{ceilDiv((# * i#), #)} (BIDx) in none of its BIDx loops: the values are another thread's)",
    # internal_error | pointwise | internal error in the pointwise scheduler's kernel (LoweringError
    '20261123:629': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (LoweringError: cannot index T#'s axis ID{#} from its loops)",
    # internal_error | reduction | internal error in the reduction scheduler's kernel (LoweringError
    '20261123:1064': "internal_error: reduction | internal error in the reduction scheduler's kernel (LoweringError: T# needs a register buffer of runtime size (ceilDiv(ceilDiv(i#, #), #) * #): split the axes right of its compute-at position (#) by constant factors, or put it in shared mem",
}
