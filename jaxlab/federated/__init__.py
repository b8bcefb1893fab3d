"""Federated learning on frozen features: partitions, client statistics, server alignment, one-shot FedAvg."""

from jaxlab.federated import client, data, head, partition, server
from jaxlab.federated.client import Channel, ClientStats, client_statistics, encode_message, extract_features
from jaxlab.federated.head import fedavg, init_head, local_train, macro_accuracy, train_clients
from jaxlab.federated.partition import dirichlet_label_skew, dirichlet_proportions, domain_per_client
from jaxlab.federated.server import Alignment, align, map_residuals

__all__ = ["client", "data", "head", "partition", "server", "Channel", "ClientStats", "client_statistics",
           "encode_message", "extract_features", "fedavg", "init_head", "local_train", "macro_accuracy",
           "train_clients", "dirichlet_label_skew", "dirichlet_proportions", "domain_per_client", "Alignment",
           "align", "map_residuals"]
