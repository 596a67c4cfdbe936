# Prometheus + Alertmanager for `make test` (included from the root Makefile).
#
# The tests start their own prometheus / prometheus-alertmanager processes on 127.0.0.1 free
# ports (tests/conftest_prom.py), so this fragment only makes sure Debian's binaries exist.
# The packages' maintainer scripts would start system services; we never want that (no
# systemd here, and the tests own their servers), so the install runs behind a policy-rc.d that
# forbids every service start (exit 101), created for the install only if the host has none.

PROMETHEUS_BINS := prometheus promtool prometheus-alertmanager amtool
PROMETHEUS_PKGS := prometheus prometheus-alertmanager

.PHONY: prometheus-install

prometheus-install:
	@missing=0; for b in $(PROMETHEUS_BINS); do command -v $$b >/dev/null || missing=1; done; \
	if [ $$missing -eq 0 ]; then exit 0; fi; \
	echo "installing $(PROMETHEUS_PKGS) (Debian packages, services not started)"; \
	created_policy=0; \
	if [ ! -e /usr/sbin/policy-rc.d ]; then \
	  printf '#!/bin/sh\n# foreshock: no service starts during package install\nexit 101\n' > /usr/sbin/policy-rc.d; \
	  chmod 755 /usr/sbin/policy-rc.d; created_policy=1; \
	fi; \
	start=$$(date +%s); \
	status=0; \
	{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(PROMETHEUS_PKGS); } >/tmp/foreshock-prometheus-install.log 2>&1 || status=$$?; \
	if [ $$created_policy -eq 1 ]; then rm -f /usr/sbin/policy-rc.d; fi; \
	if [ $$status -ne 0 ]; then tail -n 30 /tmp/foreshock-prometheus-install.log; exit $$status; fi; \
	echo "prometheus packages installed in $$(( $$(date +%s) - start )) s"; \
	for b in $(PROMETHEUS_BINS); do command -v $$b >/dev/null || { echo "missing $$b after install"; exit 1; }; done

SERVICES_UP += prometheus-install
