"""FP8 GEMM autotuning (``orch tune-fp8``, ``orch wait``) as detached, GPU-pinned jobs.

A host is tuned alone, or (``--fleet``) in a *group* of hosts with the same GPU name and SGLang commit,
which need the same configs and share one plan. The flow:

1. ``prepare`` (``prepare.py``): attach when a plan already runs on the host (one whose jobs were lost,
   to a reboot say, is failed first; one that leaves out a shape asked is refused: ``attach.py``); else
   discover on the host (the tuner's flags from its ``--help``, the runtime config directory, the GPU name,
   Triton, the SGLang commit), resolve the shapes
   (``logged.py`` for ``--shapes logged``), skip shapes already installed for this device and commit,
   keep what a failed plan finished, stop orch's server on request and refuse busy GPUs (the one policy
   of ``facts.gpus``: ``foreign_holders``, ``busy_message``, as ``serve`` refuses them).
2. plan and start (``plan.py``, pure: the schedule over every GPU of the group and the job specs;
   ``start.py``): record the plan on every member in one state transaction before any job starts (a plan
   another orch recorded meanwhile is adopted instead), then start one detached job per GPU (purpose
   ``tune.gpu<i>``: a re-run attaches, never duplicates).
3. poll (``progress.py``): read each job's log from its last byte offset and derive per-shape progress,
   percentage and ETA; ``group.py``'s ``step_group`` polls a group with one state read and at most one
   write (more when it starts missing jobs or completes the group), and completes it when every job has ended.
4. complete and install (``install.py``): merge the job-private partial files, validate them, install
   the merged configs under SGLang's exact name (backing up a replaced file), phase ``tuned``; or
   record the failure (phase ``failed``, reason and log tail) and stop the group's other jobs.

``watch.py`` is the one watcher (step groups until they end; ``ReconnectWindow`` rides out an unreachable
host); ``commands.py`` holds the entry points: ``tune_fp8`` and ``wait_tuning`` (the commands),
``wait_for_tuning`` (one host, for ``orch serve`` and ``orch run``); one host's tuning read without
waiting, ``tuning_status`` and ``status_field`` (``orch serve``, ``orch status``), is in ``progress.py``.
Tuning reports through the sessions' event sink, never a callback: each ``TuneStatus`` a poll finds is
emitted on the session of the host it is about (``Group.report``), a group's plan as ``TuningPlanned``
before any waiting, and a tuning ``orch serve`` waits for as ``TuningAwaited`` on the waiting session;
the command's view renders them (``views/tune.py``, ``views/serve.py``, ``views/run.py``).

In the state (``orchestrator/tuning_record.py``: pure pydantic, beside the state that holds it, below this
package): ``HostState.tuning`` is a typed ``TuningRecord`` (the id of the host's last plan, its state
``running``/``installed``/``failed``, per-job log progress, the installed configs), or None for a host never
tuned; ``State.tuning_plans`` holds each plan once, by id, with every job id of its group. Every operation takes
the host's ``HostSession`` (a group is a list of sessions; ``Fleet.peers`` resolves the other members of a
``--fleet`` group, with the inventory check) and reads through the session's cached facts: a poll lists the jobs
afresh (``forget("jobs")``), a job start or stop forgets ``jobs`` and ``gpus``, an install forgets
``tuned_configs``, and discovery's one round trip leaves the checkout it read as the session's ``git``.
``member.py`` holds ``Peers``, the readers (``record_of``, ``plan_of``, ``running_plan``) and ``edit_record``,
the record's one write path.
There is no facade: import a name from the module that defines it.
"""
