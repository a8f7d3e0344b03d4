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
SAMPLE_COUNT = 500
SAMPLE_MAX_ELEMENTS = 16384

KNOWN = {
    # internal_error | pointwise | internal error in the pointwise scheduler's kernel (ScheduleError
    '20261123:42': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (ScheduleError: parallelize on T#: axis # (ID{i#}) as V: a vectorized axis needs a constant extent)",
    '20261123:115': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (ScheduleError: parallelize on T#: axis # (ID{i#}) as V: a vectorized axis needs a constant extent)",
    '20261123:172': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (ScheduleError: parallelize on T#: axis # (ID{i#}) as V: a vectorized axis needs a constant extent)",
    '20261123:198': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (ScheduleError: parallelize on T#: axis # (ID{i#}) as V: a vectorized axis needs a constant extent)",
    '20261123:201': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (ScheduleError: parallelize on T#: axis # (ID{i#}) as V: a vectorized axis needs a constant extent)",
    '20261123:206': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (ScheduleError: parallelize on T#: axis # (ID{i#}) as V: a vectorized axis needs a constant extent)",
    '20261123:251': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (ScheduleError: parallelize on T#: axis # (ID{i#}) as V: a vectorized axis needs a constant extent)",
    '20261123:283': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (ScheduleError: parallelize on T#: axis # (ID{i#}) as V: a vectorized axis needs a constant extent)",
    '20261123:390': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (ScheduleError: parallelize on T#: axis # (ID{i#}) as V: a vectorized axis needs a constant extent)",
    '20261123:403': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (ScheduleError: parallelize on T#: axis # (ID{i#}) as V: a vectorized axis needs a constant extent)",
    '20261123:429': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (ScheduleError: parallelize on T#: axis # (ID{i#}) as V: a vectorized axis needs a constant extent)",
    # internal_error | pointwise | internal error in the pointwise scheduler's kernel (LoweringError
    '20261123:171': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (LoweringError: cannot index T#'s axis ID{i#} from its loops)",
    '20261123:262': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (LoweringError: cannot index T#'s axis ID{i#} from its loops)",
    '20261123:265': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (LoweringError: cannot index T#'s axis ID{i#} from its loops)",
    '20261123:336': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (LoweringError: cannot index T#'s axis ID{i#} from its loops)",
    '20261123:337': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (LoweringError: cannot index T#'s axis ID{i#} from its loops)",
    '20261123:379': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (LoweringError: cannot index T#'s axis ID{i#} from its loops)",
    '20261123:483': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (LoweringError: cannot index T#'s axis ID{i#} from its loops)",
    # internal_error | inner_persistent | internal error in the inner_persistent scheduler's kernel 
    '20261123:70': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (LoweringError: cannot index T#'s axis ID{i#} from its loops)",
    '20261123:90': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (LoweringError: cannot index T#'s axis ID{i#} from its loops)",
    '20261123:199': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (LoweringError: cannot index T#'s axis ID{i#} from its loops)",
    '20261123:223': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (LoweringError: cannot index T#'s axis ID{i#} from its loops)",
    '20261123:381': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (LoweringError: cannot index T#'s axis ID{i#} from its loops)",
    '20261123:439': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (LoweringError: cannot index T#'s axis ID{i#} from its loops)",
    # internal_error | pointwise | internal error in the pointwise scheduler's kernel (ScheduleError
    '20261123:12': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (ScheduleError: parallelize on T#: axis -# is out of range for # loop axes)",
    '20261123:13': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (ScheduleError: parallelize on T#: axis -# is out of range for # loop axes)",
    '20261123:25': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (ScheduleError: parallelize on T#: axis -# is out of range for # loop axes)",
    '20261123:83': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (ScheduleError: parallelize on T#: axis -# is out of range for # loop axes)",
    '20261123:351': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (ScheduleError: parallelize on T#: axis -# is out of range for # loop axes)",
    # wrong | pointwise | pointwise: wrong unwritten elements (float32, expanded dims)
    '20261123:159': 'wrong: pointwise | pointwise: wrong unwritten elements (float32, expanded dims)',
    '20261123:248': 'wrong: pointwise | pointwise: wrong unwritten elements (float32, expanded dims)',
    '20261123:301': 'wrong: pointwise | pointwise: wrong unwritten elements (float32, expanded dims)',
    '20261123:460': 'wrong: pointwise | pointwise: wrong unwritten elements (float32, expanded dims)',
    # internal_error | inner_persistent | internal error in the inner_persistent scheduler's kernel 
    '20261123:377': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: parallelize on T#: axis # (ID{#}) as V: # x # bytes exceeds a #-byte access)",
    '20261123:459': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: parallelize on T#: axis # (ID{#}) as V: # x # bytes exceeds a #-byte access)",
    # internal_error | inner_persistent | internal error in the inner_persistent scheduler's kernel 
    '20261123:221': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a ReductionOp, which is not recomputed)",
    '20261123:282': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a ReductionOp, which is not recomputed)",
    # internal_error | pointwise | internal error in the pointwise scheduler's kernel (LoweringError
    '20261123:68': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (LoweringError: cannot index T#'s axis ID{#} from its loops)",
    '20261123:254': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (LoweringError: cannot index T#'s axis ID{#} from its loops)",
    # wrong | pointwise | pointwise: wrong unwritten elements (bfloat16, expanded dims), values (bfl
    '20261123:4': 'wrong: pointwise | pointwise: wrong unwritten elements (bfloat16, expanded dims), values (bfloat16, expanded dims)',
    '20261123:376': 'wrong: pointwise | pointwise: wrong unwritten elements (bfloat16, expanded dims), values (bfloat16, expanded dims)',
    # illegal_access | inner_outer_persistent | InterpreterError: bulk copy source T#[(blockIdx.x * 
    '20261123:154': 'illegal_access: inner_outer_persistent | InterpreterError: bulk copy source T#[(blockIdx.x * T#_s0)]: vector access of # at element # is not aligned to # elements',
    # internal_error | inner_outer_persistent | internal error in the inner_outer_persistent schedul
    '20261123:216': "internal_error: inner_outer_persistent | internal error in the inner_outer_persistent scheduler's kernel (LoweringError: T# needs a register buffer of runtime size (ceilDiv(i#, #) * #): split the axes right of its compute-at position (#) by constant factors, or put it in shared me",
    # internal_error | inner_persistent | internal error in the inner_persistent scheduler's kernel 
    '20261123:244': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (LoweringError: T# reads T#'s buffer along ID{#}, which maps to none of its loops)",
    # internal_error | inner_persistent | internal error in the inner_persistent scheduler's kernel 
    '20261123:356': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (LoweringError: cannot index T#'s axis ID{#} from its loops)",
    # internal_error | inner_persistent | internal error in the inner_persistent scheduler's kernel 
    '20261123:267': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a FullOp, which is not recomputed)",
    # internal_error | inner_persistent | internal error in the inner_persistent scheduler's kernel 
    '20261123:67': "internal_error: inner_persistent | internal error in the inner_persistent scheduler's kernel (ScheduleError: recompute of T#: T# comes from a ReshapeOp, which is not recomputed)",
    # internal_error | pointwise | execute: TypeError: 'numpy.int64' object does not support item as
    '20261123:202': "internal_error: pointwise | execute: TypeError: 'numpy.int64' object does not support item assignment",
    # internal_error | pointwise | internal error in the pointwise scheduler's kernel (LoweringError
    '20261123:209': "internal_error: pointwise | internal error in the pointwise scheduler's kernel (LoweringError: T# needs a register buffer of runtime size ((ceilDiv(ceilDiv((i# * i#), #), #) * #) * #): split the axes right of its compute-at position (#) by constant factors, or put it ",
    # wrong | pointwise | pointwise: wrong unwritten elements (bfloat16)
    '20261123:28': 'wrong: pointwise | pointwise: wrong unwritten elements (bfloat16)',
    # wrong | pointwise | pointwise: wrong unwritten elements (bfloat16, expanded dims)
    '20261123:473': 'wrong: pointwise | pointwise: wrong unwritten elements (bfloat16, expanded dims)',
    # wrong | pointwise | pointwise: wrong unwritten elements (float32, expanded dims), values (floa
    '20261123:482': 'wrong: pointwise | pointwise: wrong unwritten elements (float32, expanded dims), values (float32, expanded dims)',
    # wrong | reduction | reduction: wrong unwritten elements (float32, expanded dims)
    '20261123:242': 'wrong: reduction | reduction: wrong unwritten elements (float32, expanded dims)',
}
