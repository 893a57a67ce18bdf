"""Cluster metadata shared by the bookie, the client and the operator: the etcd client, the key layout, ledger
metadata (a pure state machine), the metadata store (ledgers, bookie registrations, cookies), and the errors
every layer reports. Nothing here imports the bookie, the client library or the CLI."""
