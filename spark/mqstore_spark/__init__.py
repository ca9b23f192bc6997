"""mqstore on Spark: a Python Data Source over RocketMQ's record format (datasource.py) and the
compactor's heavy round (round_job.py). Imports pyspark; core and the services never import this."""
