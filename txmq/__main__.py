from txmq.cli import main

main()
