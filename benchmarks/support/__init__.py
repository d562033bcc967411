"""What the benchmark scripts share, one module per concern.

- ``paths``: where the repository, the generated data and the results are;
- ``data``: the generated input, the model's weights, a moto S3 server, the input's constants;
- ``history``: the provider as it was at an earlier commit (the "before" of a comparison);
- ``processes``: a process tree's memory, a private Ray's processes, the shared local Ray;
- ``runs``: one variant run in a child process (``benchmarks.variants``), Daft's interpreter;
- ``commits``: an output's commit records and when its ranges were committed;
- ``results``: the machine, the load average, a benchmark's tables (JSON and Markdown);
- ``cli``: the options every benchmark script takes, the parameters every variant gets;
- ``stats``: ratios, medians, timing.

Importing this package imports none of them: each script takes what it uses.
"""
