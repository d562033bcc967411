"""A warm local Ray shared by the embedded tasks of one host, stopped when idle.

Starting a local Ray costs ~5 s and stopping it ~1.7 s, and two tasks on one host that each
start one both claim every CPU and GPU. In ``shared`` mode (the default) the first embedded task
of a host starts a head that outlives it, and later tasks connect to it as drivers of their own
Ray job in well under a second. Everything lives in one folder per user, Ray version and Python
environment (:func:`.settings.head_dir`)::

    lock              flock: deciding to start, replace, join or stop the head is serialised
    head.json         the running head: address, versions, monitor and head pids
    token             the head's auth token (0600; Ray's token auth)
    clients/<id>.lock held with flock by each task while it is connected; <id>.uses the name of
                      its environment's file, <id>.share what it took of the head's CPUs and GPUs
                      (tasks take turns)
    envs/<hash>.env   a task's environment (0600), one file per distinct environment, kept while a
                      connected task or a warm worker uses it
    warm/<key>.json   the warm workers left for the next task with a runtime_env: how many, until when
    monitor.log, head.log
    head.exit.json    how the last head that died exited (its log kept as head.exited.log), for the tasks it
                      failed (:mod:`.head_watch`)
    r/                Ray's temp dir (session_*), given to Ray through a short link where its socket paths
                      would be too long (:func:`.settings.ray_temp_dir`)

The head is ``ray start --head --block`` run by a small stdlib-only **monitor**
(:mod:`.monitor`, detached from the task). The monitor stops the head once no client lock has
been held for the idle timeout, and clears the record if the head dies. Idleness is read from
the client locks, not from Ray: the kernel releases a SIGKILLed task's lock, the check needs no
dashboard (Ray's state API does) and no private GCS client, and the monitor is no Ray driver
that would keep the head busy itself.

A task's workers get its environment like workers of a per-task Ray do (whose raylet inherits
the task's environment), and a task that ends leaves warm workers for the next task with the
same environment: see :mod:`.client`.

Modules: :mod:`.settings` (the mode and its environment variables, the folder's name),
:mod:`.folder` (lock, record, client locks, environments, warm counts), :mod:`.head_processes` (telling the head's processes
apart, stopping them), :mod:`.client` (a connected task, its workers' environment),
:mod:`.head` (the task's side: join, start, replace, stop), :mod:`.monitor` (the detached
monitor), :mod:`.head_watch` (a connected task fails within seconds of the head's death), :mod:`.auth` (presenting
the head's token).
"""
