"""The training algorithms, each one unit: a module, or a folder whose parts show.

- `policy`: the base of the algorithm objects users build (`esync.ESync(...)`);
- `base`: the hooks through which an algorithm plugs into the one training loop;
- `rules`: the servers' rules' shared machinery, and SSGD's, ASGD's and DC-ASGD's rules;
- `backend`: the one interface of the parameter servers and the all-reduce;
- `pushpull` (+ `partial`): the worker of the push/pull algorithms;
- `esync/`, `sync`, `asynchronous`, `ddp/`, `standalone/`: the algorithms.

Which unit runs which `-m` is said in esync.registry. Importing this package or an
algorithm's policy imports no torch (the launchers check flags with the policies).
"""
