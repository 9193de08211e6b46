"""Building blocks of federated algorithms: the loss of a batch, local training,
client work, optimizers and the composer that joins the four stages into one process."""
