"""The two Lambdas around the hub: the daily starter (`lambdas.starter`) and the watchdog (`lambdas.watchdog`).

Deployed apart from the hub (infra/terraform/lambda.tf), they import only the kernel (`fleet`).
"""
