"""Building blocks of federated algorithms: local training, client work,
optimizers and the composer that joins the four stages into one process."""
