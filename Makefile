# Laneway. `make demo` runs the main job end to end; `make test` runs every
# test. Every tool a target needs is built from the Go module proxy into bin/.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

GO        ?= go
BIN       := $(CURDIR)/bin
PKGS      := ./...
# Bounded time per fuzz target for `make fuzz`, and per minimization of a
# new input: the default (60s) lets a target whose executions take
# milliseconds (certificate parsing) spend its whole run minimizing.
FUZZTIME  ?= 30s
FUZZMINTIME ?= 5s
# Benchmarks: pattern and count for `make bench`.
BENCH     ?= .
BENCHTIME ?= 1s
# Per-package timeout for `make test`.
TEST_TIMEOUT ?= 20m

# Envtest assets (real kube-apiserver and etcd), built from source by
# hack/envtest on first use (SPEC §12).
ENVTEST_DIR := $(BIN)/k8s
KUBE_APISERVER := $(ENVTEST_DIR)/kube-apiserver
ETCD := $(ENVTEST_DIR)/etcd
export KUBEBUILDER_ASSETS := $(ENVTEST_DIR)

.PHONY: all
all: build

##@ Build

.PHONY: build
build: ## Build every command into bin/.
	$(GO) build -o $(BIN)/ ./cmd/...

##@ Demo

.PHONY: demo
demo: build ## The weighted-share workload end to end: modelsim + epp + local gateway on loopback.
	$(BIN)/demo --bin $(BIN) --out $(CURDIR)/out/demo

##@ Test

.PHONY: test
test: envtest controller-gen helm vet ## go vet, staticcheck + go test -race over the module (builds kube-apiserver, etcd, controller-gen, helm and staticcheck into bin/ first).
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)

.PHONY: vet
vet: staticcheck ## go vet, staticcheck and a gofmt check.
	$(GO) vet $(PKGS)
	$(STATICCHECK) $(PKGS)
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './bin/*')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: bench
bench: ## Run every benchmark once with allocation figures.
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -benchtime $(BENCHTIME) $(PKGS)

.PHONY: bench-quality
bench-quality: build ## The scheduling-quality benchmark (minutes; not in make test): overload, tenants and scale scenarios of laneway simulate, one overload run both ways (real processes and simulated), and the public traces (../shared/traces, or LANEWAY_TRACES) simulated and one of them both ways. Report in out/bench-quality.
	LANEWAY_BENCH_QUALITY=1 LANEWAY_BIN=$(BIN) LANEWAY_BENCH_OUT=$(CURDIR)/out/bench-quality \
	  $(GO) test -count=1 -timeout 30m -run '^TestBenchQuality$$' -v ./internal/testbed/simulate/quality/

# The soak (`make soak`, not part of `make test`): SOAK_DURATION of open
# loop at SOAK_RATE through the real picker, TLS on, with endpoint churn
# (--endpoints-file rewritten every 2 s) and a policy change every 10 s;
# it reports RSS over time, goroutines before and after and whether every
# request was answered exactly once, and fails when a bound is broken.
SOAK_DURATION ?= 30m
SOAK_RATE     ?= 500
SOAK_ARGS     ?=

.PHONY: soak
soak: ## Soak the picker: SOAK_DURATION (30m) at SOAK_RATE (500/s) with endpoint churn and policy changes (docs/testing.md).
	$(GO) build -o $(BIN)/ ./cmd/epp ./cmd/loadgen
	$(BIN)/loadgen --soak --epp-bin $(BIN)/epp --tls --rate $(SOAK_RATE) --duration $(SOAK_DURATION) \
	  --soak-report $(CURDIR)/out/soak/report.txt $(SOAK_ARGS)

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 30s).
	@set -e; for pkg in $$($(GO) list $(PKGS)); do \
	  dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
	  for t in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go 2>/dev/null | sed 's/^func //'); do \
	    echo "== $$pkg $$t ($(FUZZTIME))"; \
	    $(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINTIME) $$pkg; \
	  done; \
	done

##@ Generate

# Code and manifest generators and the linter, built from hack/tools (its
# own module, so the tools' dependencies stay out of laneway's go.mod).
TOOLS_DIR      := hack/tools
CONTROLLER_GEN := $(BIN)/controller-gen
HELM           := $(BIN)/helm
STATICCHECK    := $(BIN)/staticcheck

.PHONY: generate
generate: controller-gen ## Generate deepcopy code for api/ (zz_generated.deepcopy.go).
	$(CONTROLLER_GEN) object paths=./api/...

.PHONY: manifests
manifests: controller-gen ## Generate the CRD manifests into config/crd/bases and the picker's Role into config/rbac.
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=laneway-epp paths=./internal/controller/... output:rbac:dir=config/rbac

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN) ## Build controller-gen into bin/.

$(CONTROLLER_GEN): $(TOOLS_DIR)/go.mod $(TOOLS_DIR)/go.sum
	cd $(TOOLS_DIR) && $(GO) build -o $(CONTROLLER_GEN) sigs.k8s.io/controller-tools/cmd/controller-gen

.PHONY: helm
helm: $(HELM) ## Build helm into bin/.

$(HELM): $(TOOLS_DIR)/go.mod $(TOOLS_DIR)/go.sum
	cd $(TOOLS_DIR) && $(GO) build -o $(HELM) helm.sh/helm/v3/cmd/helm

.PHONY: staticcheck
staticcheck: $(STATICCHECK) ## Build staticcheck into bin/.

$(STATICCHECK): $(TOOLS_DIR)/go.mod $(TOOLS_DIR)/go.sum
	cd $(TOOLS_DIR) && $(GO) build -o $(STATICCHECK) honnef.co/go/tools/cmd/staticcheck

##@ Chart and e2e

CHART       := charts/laneway
DOCKER      ?= docker
KIND        ?= kind
IMAGE_REPO  ?= ghcr.io/laneway-dev
IMAGE_TAG   ?= dev
E2E_TIMEOUT ?= 30m

.PHONY: chart-crds
chart-crds: ## Copy the generated CRDs into the chart (run after `make manifests`; a test checks they match).
	cp config/crd/bases/*.yaml $(CHART)/crds/
	cp config/crd/external/inference.networking.k8s.io_inferencepools.yaml $(CHART)/files/

.PHONY: lint-chart
lint-chart: helm envtest ## helm lint and template every charts/laneway/ci value set, then apply each rendering to a real kube-apiserver.
	$(HELM) lint --strict $(CHART)
	@set -e; for f in $(CHART)/ci/*-values.yaml; do \
	  echo "== $$f"; \
	  $(HELM) lint --strict $(CHART) -f $$f; \
	  $(HELM) template laneway $(CHART) --namespace laneway-ci --include-crds -f $$f > /dev/null; \
	done
	HELM=$(HELM) $(GO) test -race -count=1 -run '^TestChart' ./test/e2e/...

.PHONY: test-e2e
test-e2e: helm envtest ## The end-to-end suite on this machine (E2E_ENV=local): kube-apiserver, chart, epp, modelsim, local gateway.
	HELM=$(HELM) E2E_ENV=local $(GO) test -race -count=1 -timeout $(E2E_TIMEOUT) -v ./test/e2e/...

.PHONY: test-e2e-kind
test-e2e-kind: helm ## The end-to-end suite in a kind cluster through Envoy (needs docker and kind; skips without them).
	HELM=$(HELM) E2E_ENV=kind DOCKER=$(DOCKER) KIND=$(KIND) $(GO) test -count=1 -timeout $(E2E_TIMEOUT) -run '^TestE2E' -v ./test/e2e/...

.PHONY: images
images: ## Build the epp and modelsim container images (needs docker).
	$(DOCKER) build -f build/epp.Dockerfile -t $(IMAGE_REPO)/laneway-epp:$(IMAGE_TAG) .
	$(DOCKER) build -f build/modelsim.Dockerfile -t $(IMAGE_REPO)/laneway-modelsim:$(IMAGE_TAG) .

##@ Tools

.PHONY: envtest
envtest: $(KUBE_APISERVER) $(ETCD) ## Build kube-apiserver and etcd for envtest into bin/k8s.

$(KUBE_APISERVER) $(ETCD): hack/envtest/go.mod hack/envtest/go.sum
	@mkdir -p $(ENVTEST_DIR)
	cd hack/envtest && $(GO) build -o $(ENVTEST_DIR)/ ./kube-apiserver ./etcd
	@touch $(KUBE_APISERVER) $(ETCD)

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z0-9_-]+:.*?##/ { printf "  %-16s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)
