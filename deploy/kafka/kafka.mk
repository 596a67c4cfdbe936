# Apache Kafka broker for `make test` and the Kafka benchmark (included from the root Makefile).
#
# deploy/kafka/broker.sh does the work: it fetches the broker jars from Maven Central once
# (pom.xml -> deploy/kafka/target/lib), formats KRaft storage, starts the broker in the
# background and waits until it serves, or fails after a timeout printing the log tail.
# Listeners are on 127.0.0.1 only: PLAINTEXT and SASL_PLAINTEXT (SASL/PLAIN, users in
# kafka_server_jaas.conf); pytest sees them as FORESHOCK_KAFKA and FORESHOCK_KAFKA_SASL.

KAFKA_DIR := deploy/kafka
KAFKA_RUN := .run/kafka
KAFKA_PORT := 19092
KAFKA_SASL_PORT := 19093
KAFKA_CONTROLLER_PORT := 19094

export FORESHOCK_KAFKA := 127.0.0.1:$(KAFKA_PORT)
export FORESHOCK_KAFKA_SASL := 127.0.0.1:$(KAFKA_SASL_PORT)

.PHONY: kafka-jars kafka-up kafka-down bench-kafka

kafka-jars:
	@$(KAFKA_DIR)/broker.sh jars

kafka-up:
	@$(KAFKA_DIR)/broker.sh start $(KAFKA_RUN) $(KAFKA_PORT) $(KAFKA_SASL_PORT) $(KAFKA_CONTROLLER_PORT)

# Stops the broker and removes its data: every `make test` starts from an empty broker.
kafka-down:
	@$(KAFKA_DIR)/broker.sh clean $(KAFKA_RUN)

SERVICES_UP += kafka-up
SERVICES_DOWN += kafka-down

# End-to-end benchmark through a broker of its own (started and stopped here, on the fixed
# ports): agent -> broker -> faust workers -> findings; JSON line last.
BENCH_KAFKA_ARGS ?=
bench-kafka: venv
	@$(KAFKA_DIR)/broker.sh start .run/kafka-bench $(KAFKA_PORT) $(KAFKA_SASL_PORT) $(KAFKA_CONTROLLER_PORT)
	@status=0; $(PY) bench/bench_kafka.py --kafka 127.0.0.1:$(KAFKA_PORT) --broker-pid $$(cat .run/kafka-bench/broker.pid) \
	  $(BENCH_KAFKA_ARGS) || status=$$?; \
	  $(KAFKA_DIR)/broker.sh clean .run/kafka-bench; exit $$status
