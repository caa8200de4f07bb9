"""chaos_edge: the public Python API of Chaos for training scripts.

    from chaos_edge import Trainer, capture_exit_event

    trainer = Trainer(model, optimizer)
    while trainer.step < total_steps:
        loss = loss_fn(model(x), y); loss.backward()
        trainer.update()
        trainer.check_state_replication()
        if capture_exit_event():
            trainer.request_node_exit()
            break

The implementation lives in ``daemon.trainer``; ``daemon`` is also the import name of the
python-daemon library, so this module checks first that ``daemon`` is ours and says in one
line what to do when it is not.
"""

from chaos_edge._guard import ensure_own_daemon_package

ensure_own_daemon_package()

from daemon.trainer import (  # noqa: E402  (only once the guard has passed)
    StateDiverged,
    StepTiming,
    Trainer,
    TrainerError,
    capture_exit_event,
)

__all__ = ["StateDiverged", "StepTiming", "Trainer", "TrainerError", "capture_exit_event"]
