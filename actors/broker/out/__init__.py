"""What a broker tells the rest of the cluster (RocketMQ's ``broker.out``): its
registration with every NameServer."""
