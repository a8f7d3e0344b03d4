"""Helpers shared by the segmentation tests (test_segmented_plans, test_segmentation_cache)."""


def refuse_full_reductions(monkeypatch):
    """Every scheduler takes every single op now; to test reference segments, the reduction
    scheduler is made to refuse full reductions as it did before it had a schedule for them."""
    from pyfuser.schedule.schedulers import reduction
    takes = reduction.can_schedule

    def refusing(fusion):
        ok, why = takes(fusion)
        return (False, "a full reduction (refused by this test)") if why.startswith("full") \
            else (ok, why)
    monkeypatch.setattr(reduction, "can_schedule", refusing)
