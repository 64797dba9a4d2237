from fleetwise.cli import main

main()
