"""The local Apache Kafka: KRaft nodes on loopback, their certificates, the distribution Maven resolves."""
